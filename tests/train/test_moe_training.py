"""The mixture-of-experts presets train from ``train.py`` and log their router metrics."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A small model on the reverse task (a preset's own sizes shrunk), its short run's logging
SMALL = [
    "model.vocab_size=16",
    "model.d_model=32",
    "model.max_len=32",
    "data.batch_size=8",
    "data.eval_examples=8",
    "optim.warmup_steps=1",
    "train.log_every=2",
    "train.eval_every=4",
]


def _train_main():
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("preset", ["tiny-switch", "tiny-mixtral"])
def test_moe_preset_trains_from_train_py(preset, tmp_path, capsys):
    """Four steps of the reverse task: every train record holds the load-balancing loss (in
    (0, E]: ``E * sum f_e P_e`` with ``sum f_e = 1``, ``P_e <= 1``), the z-loss (>= 0) and
    the dropped fraction (0 for the dropless Mixtral preset), and the loss is finite."""
    argv = [
        str(ROOT / "configs/reverse_decoder.toml"),
        "--progress",
        "lines",
        f"model.preset={preset}",
        *SMALL,
        "train.steps=4",
        "train.checkpoint_every=4",
        f"train.workdir={tmp_path}",
    ]
    assert _train_main()(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4]
    experts = 4
    for record in train:
        assert math.isfinite(record["loss"])
        assert 0.0 < record["moe_aux_loss"] <= experts
        assert record["moe_z_loss"] >= 0.0
        assert 0.0 <= record["moe_dropped_fraction"] <= 1.0
        if preset == "tiny-mixtral":
            assert record["moe_dropped_fraction"] == 0.0
    assert any(r["split"] == "eval" for r in records)


@pytest.mark.slow  # compiles a train step twice
def test_a_checkpoint_saved_before_the_evaluation_capacity_keeps_its_capacity(
    tmp_path, capsys, script_main
):
    """A MoE checkpoint whose config predates ``model.moe_eval_capacity_factor`` (and
    ``model.nystrom_conv``, another model field added since): loading it for evaluation keeps
    the capacity it was trained and evaluated with (None: the training factor, 1.25), and
    ``train.py`` resumes it, printing the evaluation capacity's change to the new default
    (dropless) and seeing no change in the missing field at its default."""
    from tfmjax.checkpoint import Checkpointer, load_config
    from tfmjax.config import from_dict, load
    from tfmjax.train.run import build_run
    from tfmjax.train.state import create_state, to_saved

    overrides = [
        "model.preset=tiny-switch",
        *SMALL,
        "optim.schedule_steps=4",
        "train.checkpoint_every=2",
        f"train.workdir={tmp_path}",
    ]
    experiment = load(ROOT / "configs/reverse_decoder.toml", [*overrides, "train.steps=2"])
    run = build_run(experiment)
    state = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
    old = experiment.to_dict()
    del old["model"]["moe_eval_capacity_factor"], old["model"]["nystrom_conv"]
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, to_saved(state, run.tx), config=old)  # as the train loop saves it

    saved = from_dict(load_config(tmp_path))
    assert saved.model.moe_eval_capacity_factor is None
    assert saved.model.moe_eval_capacity == saved.model.moe_capacity_factor == 1.25

    argv = [str(ROOT / "configs/reverse_decoder.toml"), "--progress", "lines", *overrides]
    assert script_main("train")([*argv, "train.steps=4"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert "model.moe_eval_capacity_factor None -> 0.0" in out.out + out.err
    assert "nystrom_conv" not in out.out + out.err
    assert from_dict(load_config(tmp_path)).model.moe_eval_capacity == 0.0
