"""Training on your own task (PATH.py:Class) and your own text (text:PATH) through the
command lines: train.py, then eval.py and generate finding the task or text again from the
checkpoint, and a line naming the file when it has moved."""

import json
import shutil
from pathlib import Path

import pytest

from tfmjax.checkpoint import load_assets, load_for_inference
from tfmjax.config import from_dict
from tfmjax.evaluation.report import evaluate_checkpoint
from tfmjax.generate import main as generate_main
from tfmjax.reporting.metrics_log import read_records
from tfmjax.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
TINY = """
[model]
family = "{family}"
vocab_size = {vocab}
d_model = 16
num_heads = 2
d_ff = 32
num_layers = 1
max_len = 32
position = "learned"

[optim]
learning_rate = 1e-2
warmup_steps = 2

[data]
task = "{task}"
task_params = {params}
batch_size = 8
eval_examples = 8

[train]
steps = 4
log_every = 2
eval_every = 4
checkpoint_every = 4
best_metric = "{best}"
"""


def config(path: Path, task: str, *, params="{}", family="decoder_only", vocab=8, best="loss"):
    path.write_text(TINY.format(task=task, params=params, family=family, vocab=vocab, best=best))
    return str(path)


def last_eval(workdir: Path) -> dict:
    return [r for r in read_records(workdir / "metrics.jsonl") if r["split"] == "eval"][-1]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_own_task_trains_evaluates_generates_and_is_found_again(
    tmp_path, monkeypatch, capsys, script_main
):
    project, runs = tmp_path / "project", tmp_path / "runs"
    (project / "tasks").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "parity.py", project / "tasks" / "parity.py")
    task = "tasks/parity.py:ParityTask"
    monkeypatch.chdir(project)
    cfg = config(project / "own.toml", task, params="{ max_len = 4 }")
    workdir = runs / "own"
    assert script_main("train")([cfg, f"train.workdir={workdir}", "--progress", "lines"]) == 0
    _, _, step = load_for_inference(workdir)
    assert step == 4
    origin = load_assets(workdir, step)["task_origin"]
    assert origin["task"] == task and origin["file"] == str(project / "tasks" / "parity.py")

    monkeypatch.chdir(tmp_path)  # elsewhere: the recorded path finds the task
    capsys.readouterr()
    assert script_main("eval")([str(workdir)]) == 0
    report = json.loads((workdir / "eval.json").read_text())
    assert report["task"] == task
    for key in ("loss", "token_accuracy", "exact_match"):  # the run's own last evaluation
        assert report[key] == pytest.approx(last_eval(workdir)[key], rel=1e-5)
    capsys.readouterr()
    assert generate_main([str(workdir), "--input", "1011"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("1011 -> ")  # the task reads "1011" as "1 0 1 1"
    assert set(out.removeprefix("1011 -> ").split()) <= {"0", "1"}

    shutil.move(project, tmp_path / "moved")  # the task file is gone from where it was
    for main, args in ((script_main("eval"), []), (generate_main, ["--input", "1 0"])):
        assert main([str(workdir), *args]) == 2
        err = one_error_line(capsys)
        assert f"task file {project / 'tasks' / 'parity.py'} of data.task={task!r}" in err
        assert "recorded in the checkpoint, is gone: put it back there" in err
    monkeypatch.chdir(tmp_path / "moved")  # the same bytes at the configured path: found
    assert script_main("eval")([str(workdir)]) == 0


def test_own_task_mistakes_stop_train_py_in_one_line(tmp_path, monkeypatch, capsys, script_main):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("class NotATask:\n    pass\n")
    for task, says in (
        ("missing.py:T", "task file 'missing.py' of data.task='missing.py:T' does not exist"),
        ("t.py:Nope", "has no class 'Nope'"),
        ("t.py:NotATask", "is not a task: a task is a subclass of tfmjax.data.Task"),
        ("text:none.txt", "text file 'none.txt' of data.task='text:none.txt' does not exist"),
    ):
        cfg = config(tmp_path / "bad.toml", task)
        assert script_main("train")([cfg, f"train.workdir={tmp_path / 'w'}"]) == 2
        err = one_error_line(capsys)
        assert err.startswith(f"error: data.task={task!r}: ") and says in err, err
        assert not (tmp_path / "w" / "checkpoints").exists()


TEXT = "".join(f"{i}: the quick brown fox jumps over the lazy dog.\n" for i in range(80))


def test_own_text_trains_a_language_model(tmp_path, monkeypatch, capsys, script_main):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(TEXT)
    params = "{ context = 16, sample_tokens = 4 }"
    cfg = config(tmp_path / "lm.toml", "text:corpus.txt", params=params, vocab=48)
    workdir = tmp_path / "lm"
    assert script_main("train")([cfg, f"train.workdir={workdir}", "--progress", "lines"]) == 0
    evaluated = last_eval(workdir)
    assert len(evaluated["samples"]) == 3  # sampled continuations, as Shakespeare's
    assets = load_assets(workdir, 4)
    assert assets["task_origin"]["file"] == str(tmp_path / "corpus.txt")
    assert set(assets["tokenizer"]["symbols"]) == set(TEXT)
    report = evaluate_checkpoint(workdir)
    assert report["bits_per_char"] == pytest.approx(evaluated["bits_per_char"], rel=1e-5)
    capsys.readouterr()
    assert generate_main([str(workdir), "--input", "the", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the")

    (tmp_path / "corpus.txt").rename(tmp_path / "elsewhere.txt")
    assert script_main("eval")([str(workdir)]) == 2  # evaluation reads the text again
    err = one_error_line(capsys)
    assert f"text file {tmp_path / 'corpus.txt'} of data.task='text:corpus.txt'" in err
    # generation needs only the tokenizer the checkpoint holds
    assert generate_main([str(workdir), "--input", "the", "--max-new-tokens", "3"]) == 0


def test_own_text_trains_a_masked_lm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(TEXT)
    raw = {
        "model": {"family": "encoder_only", "vocab_size": 48, "d_model": 16, "num_heads": 2},
        "optim": {"learning_rate": 1e-2, "warmup_steps": 2},
        "data": {
            "task": "text:corpus.txt",
            "task_params": {"context": 16},
            "batch_size": 8,
            "eval_examples": 8,
        },
        "train": {
            "steps": 4,
            "log_every": 2,
            "eval_every": 4,
            "checkpoint_every": 4,
            "best_metric": "token_accuracy",
            "workdir": str(tmp_path / "mlm"),
        },
    }
    raw["model"].update(d_ff=32, num_layers=1, max_len=16, position="learned")
    with open(tmp_path / "log.txt", "w") as stream:
        result = train(from_dict(raw), progress=False, plot=False, stream=stream)
    assert result["step"] == 4
    assert 0.0 < result["eval"]["unigram_accuracy"] < 1.0
    report = evaluate_checkpoint(tmp_path / "mlm")
    assert report["token_accuracy"] == pytest.approx(result["eval"]["token_accuracy"])
    assert "<mask>" in "".join(row["input"] for row in report["examples"])
