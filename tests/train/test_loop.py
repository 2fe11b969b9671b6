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

from tfmjax.checkpoint import load_for_inference, params_hash
from tfmjax.config import ConfigError, from_dict
from tfmjax.models import InputError
from tfmjax.reporting.metrics_log import read_records
from tfmjax.train.loop import NonFiniteLossError, dtype_note, train

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 600  # only against hangs: the CLI tests wait for events, never for a time


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
    assert not (tmp_path / "checkpoints").exists()  # made by the run, empty: removed again


def test_vocab_too_small_names_both_sizes(tmp_path):
    exp = tiny_experiment(tmp_path)
    exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, vocab_size=8))
    with pytest.raises(ConfigError, match=r"model.vocab_size=8 .* task 'copy' \(10 ids\)"):
        quiet(exp)


def _cli(*args, **kw):
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kw}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, text=True, **kw
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


def _wait_for(condition, proc, what: str):
    """Poll ``condition()`` until it is true; fail if the process ends first or it hangs."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"train.py exited {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {HANG_S}s: hung")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_saves_and_exits_zero(tmp_path):
    """SIGTERM sent once the first log record (step 10) is on disk, however long that took:
    the run saves the step it is on, says which, and exits 0."""
    config = _write_config(tmp_path, steps=100_000, checkpoint_every=100_000, eval_every=100_000)
    metrics = tmp_path / "run" / "metrics.jsonl"
    out_file, err_file = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out_file.open("w") as out, err_file.open("w") as err:  # files: a pipe could fill up
        proc = _cli(str(config), "--progress", "lines", stdout=out, stderr=err)
        try:
            _wait_for(lambda: read_records(metrics), proc, "the first log record")
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out, err = out_file.read_text(), err_file.read_text()
    assert code == 0, err
    steps = [int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert len(steps) == 1 and 10 <= steps[0] < 100_000
    # "saving" while the save runs, "saved" once it has finished (not before: a second
    # signal in between says which older checkpoint is intact)
    saving = out.index(f"SIGTERM: saving step {steps[0]}; stopping\n")
    assert out.index(f"SIGTERM: saved step {steps[0]}; stopping; rerun") > saving
    assert read_records(metrics)[0]["step"] == 10


def test_bad_config_is_one_line_and_exit_2(tmp_path):
    """train.py with an invalid override: exit 2 and one stderr line naming key and value."""
    config = _write_config(tmp_path)
    proc = _cli(str(config), "model.dropout_rate=1.5")
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert "model.dropout_rate=1.5" in err


def test_every_training_batch_is_checked(tmp_path, monkeypatch):
    """The loop runs check_batch on every batch, not only on the first: an id outside the
    vocabulary in batch 3 stops the run with a one-line InputError before that step runs."""
    import tfmjax.data.sources as sources

    real_make_batch = sources.make_batch

    def make_batch(task, **kw):
        batch = real_make_batch(task, **kw)
        if kw["step"] == 3:
            batch = dict(batch, inputs=batch["inputs"].copy())
            batch["inputs"][0, 0] = 16  # model.vocab_size: one past the last id
        return batch

    monkeypatch.setattr(sources, "make_batch", make_batch)  # what the toy source calls
    done = []
    with pytest.raises(InputError, match=r"inputs has token id 16 at index \[0, 0\]") as info:
        quiet(tiny_experiment(tmp_path), on_step=done.append)
    assert "\n" not in str(info.value)
    assert done == [1, 2, 3]  # steps 1-3 ran on good batches; step 4 never ran


def _checkpoint_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_cli_non_finite_loss_exits_1_and_keeps_the_last_checkpoint(tmp_path):
    """train.py, resumed at step 20 with a learning rate that blows up: one line on stderr,
    exit 1, checkpoint 20 (the last good one) still holds the same params, nothing newer is
    saved and no record past step 20 is written."""
    workdir = tmp_path / "run"
    quiet(tiny_experiment(workdir, checkpoint_every=10), plot=False)  # 20 good steps
    assert _checkpoint_steps(workdir) == [10, 20]
    _, before, _ = load_for_inference(workdir / "checkpoints" / "20")
    config = _write_config(tmp_path, checkpoint_every=10)  # the same config as a TOML file
    overrides = ["train.steps=40", "optim.learning_rate=1e30"]
    proc = _cli(str(config), *overrides, "--override-config", "--progress", "lines")
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 1, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert "non-finite loss or gradient at step" in err
    assert "the last checkpoint (step 20) is untouched" in err
    assert _checkpoint_steps(workdir) == [10, 20]
    _, after, _ = load_for_inference(workdir / "checkpoints" / "20")
    assert params_hash(after) == params_hash(before)
    assert max(r["step"] for r in read_records(workdir / "metrics.jsonl")) == 20


def test_the_header_notes_a_float32_run_on_an_accelerator():
    """float32 stays the default (CPUs, the same numbers on every machine); on a GPU or TPU
    the run header says how to compute in bfloat16, which the README's GPU figures used."""
    for backend in ("gpu", "tpu"):
        assert dtype_note(backend, "float32") == (
            f"note: model.dtype=float32 on {backend}: model.dtype=bfloat16 computes in bfloat16 "
            "(parameters and optimizer state stay float32), as the README's GPU figures did"
        )
    assert dtype_note("cpu", "float32") == dtype_note("gpu", "bfloat16") == ""
