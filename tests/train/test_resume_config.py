"""Rerunning into a workdir that holds a run: allowed changes apply, others are refused
unless overridden (and then recorded)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfmjax.checkpoint import CheckpointError, load_config
from tfmjax.config import from_dict
from tfmjax.reporting.metrics_log import read_records
from tfmjax.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 600  # a hang guard for the CLI runs, not a speed limit
RAW = {
    "model": {"family": "decoder_only", "vocab_size": 16, "d_model": 16, "num_heads": 2,
              "d_ff": 32, "num_layers": 1},
    "optim": {"learning_rate": 3e-3, "warmup_steps": 2},
    "data": {"task": "copy", "task_params": {"num_symbols": 5, "max_len": 4},
             "batch_size": 8, "eval_examples": 8},
    "train": {"steps": 4, "log_every": 2, "eval_every": 4, "checkpoint_every": 2},
}  # fmt: skip


def experiment(workdir, **changes):
    raw = json.loads(json.dumps(RAW))
    raw["train"]["workdir"] = str(workdir)
    for key, value in changes.items():
        section, name = key.split("__")
        raw[section][name] = value
    return from_dict(raw, name="resume")


def run(exp, **kw):
    out = io.StringIO()
    result = train(exp, progress=False, plot=False, stream=out, **kw)
    return result, out.getvalue()


@pytest.fixture
def finished(tmp_path):
    run(experiment(tmp_path))
    return tmp_path


def test_more_steps_resume_and_say_so(finished):
    """More steps on the schedule the run had (optim.schedule_steps: the cosine's 4 steps;
    tests/train/test_resume_schedule.py has the rest)."""
    exp = experiment(finished, train__steps=6, train__log_every=3, optim__schedule_steps=4)
    result, out = run(exp)
    assert result["step"] == 6
    changes = ["optim.schedule_steps 0 -> 4", "train.log_every 2 -> 3", "train.steps 4 -> 6"]
    assert f"resuming step 4 with {', '.join(changes)}" in out
    config = [r for r in read_records(finished / "metrics.jsonl") if r["split"] == "config"]
    assert config == [{"step": 4, "split": "config", "changes": changes}]
    assert load_config(finished)["train"]["steps"] == 6


def test_finished_run_names_its_step_and_how_to_extend(finished):
    result, out = run(experiment(finished))
    assert result["step"] == 4
    assert "finished at step 4 (train.steps=4): nothing to do" in out
    assert "rerun with train.steps=8" in out


def test_other_changes_are_refused_with_the_ways_out(finished):
    with pytest.raises(CheckpointError) as err:
        run(experiment(finished, optim__learning_rate=1e-3, train__steps=6, model__d_ff=64))
    message = str(err.value)
    assert "\n" not in message
    assert "holds a run (step 4) with a different config" in message
    assert "model.d_ff 32 -> 64" in message and "optim.learning_rate 0.003 -> 0.001" in message
    assert "train.steps" not in message  # allowed: not listed as refused
    # a wider FFN cannot take the checkpoint's arrays: only a new run is offered
    assert message.endswith("Its parameters do not fit this model, so start a new run: "
                            "train.workdir=NEW_DIR")  # fmt: skip
    assert "--override-config" not in message
    with pytest.raises(CheckpointError) as err:  # what fits gets both ways out
        run(experiment(finished, optim__learning_rate=1e-3, model__dropout_rate=0.1))
    assert str(err.value).endswith(
        "Start a new run with train.workdir=NEW_DIR, or continue this one with the new "
        "settings: --override-config"
    )
    assert load_config(finished)["optim"]["learning_rate"] == 3e-3  # nothing touched


def test_override_continues_and_records_the_new_config(finished):
    exp = experiment(finished, optim__learning_rate=1e-3, train__steps=6)
    result, out = run(exp, override_config=True)
    assert result["step"] == 6
    assert "optim.learning_rate 0.003 -> 0.001" in out
    assert load_config(finished)["optim"]["learning_rate"] == 1e-3
    (record,) = [r for r in read_records(finished / "metrics.jsonl") if r["split"] == "config"]
    assert "optim.learning_rate 0.003 -> 0.001" in record["changes"]
    assert "nothing to do" in run(exp)[1]  # the recorded config is the new one: no refusal


def _toml(finished) -> Path:
    """RAW as a TOML file (the workdir is given on the command line)."""
    config = finished / "resume.toml"
    config.write_text(
        "\n".join(f"[{s}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in vals.items()
                                        if not isinstance(v, dict))
                  for s, vals in RAW.items())
        + '\n[data.task_params]\nnum_symbols = 5\nmax_len = 4\n'
    )  # fmt: skip
    return config


def _train_cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "train.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=env)


def test_cli_refuses_a_different_model_config_in_one_line(finished):
    """train.py into a workdir whose run has another model (d_ff 32 there, 64 now): exit 2,
    one line naming the change and both ways out, and the checkpoint's config unchanged."""
    before = load_config(finished)
    refused = _train_cli(
        _toml(finished), f"train.workdir={finished}", "model.d_ff=64", "--progress", "lines"
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().count("\n") == 0 and "Traceback" not in refused.stderr
    assert "holds a run (step 4) with a different config" in refused.stderr
    assert "model.d_ff 32 -> 64" in refused.stderr
    assert "start a new run: train.workdir=NEW_DIR" in refused.stderr
    assert "--override-config" not in refused.stderr  # it could not restore these arrays
    assert load_config(finished) == before


@pytest.mark.slow
def test_cli_refuses_in_one_line_then_override_flag_continues(finished):
    """An optim change through train.py: refused (exit 2, one line), then continued with
    --override-config to the new train.steps."""
    config = _toml(finished)
    args = [config, f"train.workdir={finished}", "optim.learning_rate=0.001", "train.steps=6",
            "--progress", "lines"]  # fmt: skip
    refused = _train_cli(*args)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "--override-config" in refused.stderr
    ok = _train_cli(*args, "--override-config")
    assert ok.returncode == 0, ok.stderr
    assert "done: step 6" in ok.stdout
