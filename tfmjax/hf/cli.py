"""``python -m tfmjax.hf import HF_DIR WORKDIR`` and ``python -m tfmjax.hf export WORKDIR HF_DIR``.

``import`` writes a tfmjax checkpoint (step 0: the params and the experiment config) that
``eval.py``, ``python -m tfmjax.generate`` and the interpretability tools read, plus
``WORKDIR/hf_config.json`` (the original ``config.json``, whose token ids and dtype
``export`` writes back) and ``WORKDIR/finetune.toml`` (the model section and
``train.init_from = WORKDIR``: ``train.py WORKDIR/finetune.toml data.task=...`` fine-tunes
it). ``export`` writes ``config.json`` and ``model.safetensors`` of the
newest good checkpoint under WORKDIR. Errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tfmjax.checkpoint import Checkpointer, CheckpointError, load_for_inference
from tfmjax.config import ConfigError, Experiment, ModelConfig, TrainConfig, from_dict
from tfmjax.hf.api import load, save
from tfmjax.hf.errors import HFError

HF_CONFIG = "hf_config.json"
FINETUNE = "finetune.toml"


def toml_value(value) -> str:
    """A TOML literal of a config value (str, bool, int or float)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def finetune_toml(experiment: Experiment) -> str:
    """An experiment file: the imported ``[model]`` and ``train.init_from``. A None field is
    left out where None is its default, else written ``"none"`` (TOML has no null)."""
    model = dataclasses.asdict(experiment.model)
    defaults = dataclasses.asdict(ModelConfig())
    model = {k: "none" if v is None and defaults[k] is not None else v for k, v in model.items()}
    lines = [
        "# Written by python -m tfmjax.hf import; pick a data.task to fine-tune on.",
        "[model]",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in model.items() if v is not None]
    lines += ["", "[train]", f"init_from = {toml_value(experiment.train.workdir)}"]
    return "\n".join(lines) + "\n"


def import_checkpoint(hf_dir: str | Path, workdir: str | Path) -> Experiment:
    """Write the HF model in ``hf_dir`` as checkpoint step 0 of ``workdir``."""
    workdir = Path(workdir)
    if (workdir / "checkpoints").exists() and any((workdir / "checkpoints").iterdir()):
        raise HFError(f"{workdir} already holds checkpoints: import into a new workdir")
    cfg, params = load(hf_dir)
    train = TrainConfig(workdir=str(workdir.absolute()))
    experiment = Experiment(name=workdir.name, model=cfg, train=train)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / HF_CONFIG).write_text((Path(hf_dir) / "config.json").read_text())
    (workdir / FINETUNE).write_text(finetune_toml(experiment))
    with Checkpointer(workdir, keep=1) as ckpt:
        ckpt.save(0, {"params": params}, config=experiment)
    return experiment


def export_checkpoint(workdir: str | Path, hf_dir: str | Path, dtype: str | None = None) -> int:
    """Write the newest good checkpoint of ``workdir`` to ``hf_dir``; returns its step."""
    raw, params, step = load_for_inference(workdir)
    cfg = from_dict(raw).model
    original = Path(workdir) / HF_CONFIG
    extra = json.loads(original.read_text()) if original.is_file() else {}
    dtype = dtype or extra.get("dtype") or extra.get("torch_dtype") or "float32"
    save(cfg, params, hf_dir, dtype=dtype, extra=extra)
    return step


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmjax.hf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="HF directory -> tfmjax checkpoint")
    imp.add_argument("hf_dir", help="directory with config.json and model.safetensors")
    imp.add_argument("workdir", help="new tfmjax workdir (checkpoints/0 is written)")
    exp = sub.add_parser("export", help="tfmjax checkpoint -> HF directory")
    exp.add_argument("workdir", help="a tfmjax workdir, its checkpoints dir, or one step dir")
    exp.add_argument("hf_dir", help="directory to write config.json and model.safetensors to")
    exp.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            experiment = import_checkpoint(args.hf_dir, args.workdir)
            m = experiment.model
            print(
                f"imported {args.hf_dir} -> {args.workdir}/checkpoints/0 ({m.family}, "
                f"{m.num_layers} layers, d_model {m.d_model}, vocab {m.vocab_size})"
            )
        else:
            step = export_checkpoint(args.workdir, args.hf_dir, args.dtype)
            print(f"exported {args.workdir} step {step} -> {args.hf_dir}")
    except (HFError, ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
