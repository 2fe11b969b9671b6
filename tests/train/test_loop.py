"""The training loop and the train.py CLI: learning, files, non-finite loss, signals, bad config."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfmjax.config import ConfigError, from_dict
from tfmjax.train.loop import NonFiniteLossError, train
from tfmjax.train.metrics_log import read_records

ROOT = Path(__file__).resolve().parents[2]


def tiny_experiment(workdir, *, family="encoder_decoder", task="copy", steps=20, **train_kw):
    return from_dict(
        {
            "model": {
                "family": family,
                "vocab_size": 16,
                "d_model": 32,
                "num_heads": 2,
                "d_ff": 64,
                "num_layers": 1,
                "tie_embeddings": False,
            },
            "optim": {"learning_rate": 3e-3, "warmup_steps": 20},
            "data": {
                "task": task,
                "task_params": {"num_symbols": 5, "max_len": 5},
                "batch_size": 32,
                "eval_examples": 64,
            },
            "train": {
                "steps": steps,
                "log_every": 10,
                "eval_every": steps,
                "checkpoint_every": steps,
                "workdir": str(workdir),
                **train_kw,
            },
        },
        name="tiny",
    )


def quiet(exp, **kw):
    return train(exp, progress=False, stream=open(os.devnull, "w"), **kw)


@pytest.mark.slow
def test_tiny_run_learns_copy(tmp_path):
    result = quiet(tiny_experiment(tmp_path, steps=300))
    assert result["eval"]["exact_match"] >= 0.95, result["eval"]
    records = read_records(tmp_path / "metrics.jsonl")
    train_rec = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_rec] == list(range(10, 301, 10))
    for key in (
        "loss",
        "perplexity",
        "token_accuracy",
        "exact_match",
        "grad_norm",
        "learning_rate",
    ):
        assert key in train_rec[-1]
    assert {"tokens_per_sec", "steps_per_sec", "elapsed_sec"} <= set(train_rec[-1]["timing"])
    assert train_rec[-1]["loss"] < 0.2 * train_rec[0]["loss"]
    assert (tmp_path / "metrics.png").stat().st_size > 0
    assert (tmp_path / "checkpoints" / "300").is_dir()


def test_non_finite_loss_stops_without_saving(tmp_path):
    exp = tiny_experiment(tmp_path, steps=20, checkpoint_every=5)
    exp = dataclasses.replace(
        exp,
        optim=dataclasses.replace(exp.optim, learning_rate=1e30, clip_norm=None, warmup_steps=0),
    )
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss or gradient at step \d+"):
        quiet(exp)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []


def test_vocab_too_small_names_both_sizes(tmp_path):
    exp = tiny_experiment(tmp_path)
    exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, vocab_size=8))
    with pytest.raises(ConfigError, match=r"model.vocab_size=8 .* task 'copy' \(10 ids\)"):
        quiet(exp)


def _cli(*args, **kw):
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def _write_config(tmp_path, **train_kw) -> Path:
    exp = tiny_experiment(tmp_path / "run", **train_kw)
    lines = []
    for section in ("model", "optim", "data", "train"):
        lines.append(f"[{section}]")
        for key, value in exp.to_dict()[section].items():
            if value is not None and value != {}:
                lines.append(f"{key} = {json.dumps(value)}")
    lines.append("[data.task_params]\nnum_symbols = 5\nmax_len = 5")
    path = tmp_path / "tiny.toml"
    path.write_text("\n".join(l for l in lines if not l.startswith("task_params")) + "\n")
    return path


@pytest.mark.slow
def test_sigterm_saves_and_exits_zero(tmp_path):
    config = _write_config(tmp_path, steps=100_000, checkpoint_every=100_000, eval_every=100_000)
    proc = _cli(str(config), "--progress", "lines")
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while not read_records(metrics) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: saved step" in out
    steps = [int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert len(steps) == 1 and 10 <= steps[0] < 100_000


def test_bad_config_is_one_line_and_exit_2(tmp_path):
    config = _write_config(tmp_path)
    proc = _cli(str(config), "model.dropout_rate=1.5")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert "model.dropout_rate=1.5" in err
