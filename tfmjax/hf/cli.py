"""``python -m tfmjax.hf import HF_DIR WORKDIR`` and ``python -m tfmjax.hf export WORKDIR HF_DIR``.

``import`` writes a tfmjax checkpoint (step 0: the params and the experiment config) that
``eval.py``, ``python -m tfmjax.generate`` and the interpretability tools read. Its assets
hold the original ``config.json`` and dtype (``"hf"``: whose token ids and dtype ``export``
writes back) and, when ``tokenizer.json`` sits beside the weights, the model's tokenizer
(``"tokenizer"``: ``generate --input "text"`` encodes with it); a run fine-tuned from it
(``train.init_from``) saves both again with every step. ``WORKDIR/hf_config.json`` is the
original ``config.json`` too, and ``WORKDIR/finetune.toml`` the model section and
``train.init_from = WORKDIR``: ``train.py WORKDIR/finetune.toml data.task=...`` fine-tunes
it. ``export`` writes ``config.json``, ``model.safetensors`` (in the imported dtype unless
``--dtype`` says otherwise) and the tokenizer files of the newest good checkpoint under
WORKDIR. Errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import tfmjax.hf.tensors as tensors
import tfmjax.hf.tokenizer as hf_tokenizer
from tfmjax.checkpoint import (
    NO_HF_TOKENIZER,
    Checkpointer,
    CheckpointError,
    load_assets,
    load_for_inference,
)
from tfmjax.config import ConfigError, Experiment, ModelConfig, TrainConfig, from_dict
from tfmjax.data.tokenizers import tokenizer_from_dict
from tfmjax.hf.api import load, read_config, save
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


def import_assets(hf_dir: str | Path) -> dict:
    """What the checkpoint of an import carries beside the params: ``"hf"`` (the original
    ``config.json`` and the dtype its tensors are stored in) and, when ``hf_dir`` has a
    ``tokenizer.json``, ``"tokenizer"``."""
    raw = read_config(hf_dir)
    dtype = tensors.stored_dtype(hf_dir) or raw.get("dtype") or raw.get("torch_dtype")
    assets = {"hf": {"config": raw, "dtype": dtype}}
    tokenizer = hf_tokenizer.read(hf_dir)
    if tokenizer is not None:
        assets["tokenizer"] = tokenizer.to_dict()
    return assets


def import_checkpoint(hf_dir: str | Path, workdir: str | Path) -> Experiment:
    """Write the HF model in ``hf_dir`` as checkpoint step 0 of ``workdir``, with its
    original config, dtype and tokenizer in the checkpoint's assets (:func:`import_assets`)."""
    workdir = Path(workdir)
    if (workdir / "checkpoints").exists() and any((workdir / "checkpoints").iterdir()):
        raise HFError(f"{workdir} already holds checkpoints: import into a new workdir")
    cfg, params = load(hf_dir)
    assets = import_assets(hf_dir)
    train = TrainConfig(workdir=str(workdir.absolute()))
    experiment = Experiment(name=workdir.name, model=cfg, train=train)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / HF_CONFIG).write_text((Path(hf_dir) / "config.json").read_text())
    (workdir / FINETUNE).write_text(finetune_toml(experiment))
    with Checkpointer(workdir, keep=1) as ckpt:
        ckpt.save(0, {"params": params}, config=experiment, assets=assets)
    return experiment


def export_checkpoint(workdir: str | Path, hf_dir: str | Path, dtype: str | None = None) -> int:
    """Write the newest good checkpoint of ``workdir`` to ``hf_dir`` (and the tokenizer it
    carries); returns its step. ``dtype``: default the imported model's own (float32 for a
    model that was never imported)."""
    raw, params, step = load_for_inference(workdir)
    cfg = from_dict(raw).model
    assets = load_assets(workdir, step)
    original = assets.get("hf") or {}
    extra = original.get("config")
    if extra is None:  # a checkpoint imported before the assets held it
        path = Path(workdir) / HF_CONFIG
        extra = json.loads(path.read_text()) if path.is_file() else {}
    dtype = (
        dtype
        or original.get("dtype")
        or extra.get("dtype")
        or extra.get("torch_dtype")
        or "float32"
    )
    save(cfg, params, hf_dir, dtype=dtype, extra=extra)
    tokenizer = assets.get("tokenizer") or {}
    if tokenizer.get("kind") == "hf":
        hf_tokenizer.write(tokenizer_from_dict(tokenizer), hf_dir)
    return step


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmjax.hf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="HF directory -> tfmjax checkpoint")
    imp.add_argument(
        "hf_dir", help="directory with config.json and model.safetensors (and tokenizer.json)"
    )
    imp.add_argument("workdir", help="new tfmjax workdir (checkpoints/0 is written)")
    exp = sub.add_parser("export", help="tfmjax checkpoint -> HF directory")
    exp.add_argument("workdir", help="a tfmjax workdir, its checkpoints dir, or one step dir")
    exp.add_argument(
        "hf_dir", help="directory to write config.json, model.safetensors and the tokenizer to"
    )
    exp.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="the tensors' dtype on disk (default: the imported model's own; else float32)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            experiment = import_checkpoint(args.hf_dir, args.workdir)
            m = experiment.model
            print(
                f"imported {args.hf_dir} -> {args.workdir}/checkpoints/0 ({m.family}, "
                f"{m.num_layers} layers, d_model {m.d_model}, vocab {m.vocab_size})"
            )
            if not (Path(args.hf_dir) / hf_tokenizer.TOKENIZER).is_file():
                print(f"hint: {NO_HF_TOKENIZER}")
        else:
            step = export_checkpoint(args.workdir, args.hf_dir, args.dtype)
            print(f"exported {args.workdir} step {step} -> {args.hf_dir}")
    except (HFError, ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
