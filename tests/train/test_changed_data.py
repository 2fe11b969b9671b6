"""A checkpoint's own task or text file is the one it was trained on: an edited file is refused
in one line by every entry point (eval.py, generate, interp, train.py's resume, the Python
API's load, evaluate and fit) and accepted with ``--accept-changed-data`` /
``accept_changed_data=True``; a resumed run then records the new digest."""

import contextlib
import hashlib
import shutil
from pathlib import Path

import pytest

import tfmjax
from tfmjax.checkpoint import CheckpointError, load_assets
from tfmjax.config import from_dict
from tfmjax.generate import main as generate_main
from tfmjax.interp import analyses
from tfmjax.interp.cli import main as interp_main
from tfmjax.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
TEXT = "".join(f"{i}: the quick brown fox jumps over the lazy dog.\n" for i in range(80))
REFUSED = "is not the one the checkpoint was trained on"
FIX = "restore that file, or accept the change with --accept-changed-data"


def experiment(task: str, workdir: Path, *, vocab: int, params: dict, steps: int = 4) -> dict:
    return {
        "model": {
            "family": "decoder_only",
            "vocab_size": vocab,
            "d_model": 16,
            "num_heads": 2,
            "d_ff": 32,
            "num_layers": 1,
            "max_len": 32,
            "position": "learned",
        },
        # the schedule spans the first 4 steps, so a resume to 8 keeps its rates
        "optim": {"learning_rate": 1e-2, "warmup_steps": 2, "schedule_steps": 4},
        "data": {"task": task, "task_params": params, "batch_size": 8, "eval_examples": 8},
        "train": {
            "steps": steps,
            "log_every": 2,
            "eval_every": 4,
            "checkpoint_every": 4,
            "best_metric": "loss",
            "workdir": str(workdir),
        },
    }


TASK = "tasks/parity.py:ParityTask"
TEXT_TASK = "text:corpus.txt"
RUNS = {  # run name: (data.task, vocab_size, task_params)
    "task": (TASK, 8, {"max_len": 4}),
    "text": (TEXT_TASK, 48, {"context": 16, "sample_tokens": 4}),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder with an own task file and an own text file, and a 4-step run on each
    (``runs/task``, ``runs/text``), trained from that folder."""
    root = tmp_path_factory.mktemp("changed_data")
    (root / "tasks").mkdir()
    shutil.copy(ROOT / "examples" / "parity.py", root / "tasks" / "parity.py")
    (root / "corpus.txt").write_text(TEXT)
    with contextlib.chdir(root), open(root / "log.txt", "w") as log:
        for name, (task, vocab, params) in RUNS.items():
            raw = experiment(task, root / "runs" / name, vocab=vocab, params=params)
            assert train(from_dict(raw), progress=False, plot=False, stream=log)["step"] == 4
    return root


@contextlib.contextmanager
def edited(path: Path, line: str):
    """``path`` with ``line`` added while the block runs."""
    original = path.read_bytes()
    path.write_bytes(original + line.encode())
    try:
        yield hashlib.sha256(path.read_bytes()).hexdigest()
    finally:
        path.write_bytes(original)


def one_refusal(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: checkpoint step 4: ") and REFUSED in err and FIX in err, err
    return err


def resume_cli(script_main, project: Path, run: str, *flags: str) -> int:
    """train.py on a copy of ``runs/RUN`` with train.steps=8: a resume from step 4."""
    task, vocab, params = RUNS[run]
    copy = project / "runs" / f"{run}-resumed"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(project / "runs" / run, copy)
    raw = experiment(task, copy, vocab=vocab, params=params, steps=8)
    config = project / f"{run}.toml"
    config.write_text(_toml(raw))
    return script_main("train")([str(config), "--progress", "lines", *flags])


def _toml(raw: dict) -> str:
    def value(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return f'"{v}"' if isinstance(v, str) else repr(v)

    return "".join(
        f"[{section}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in keys.items())
        for section, keys in raw.items()
    )


def test_an_edited_task_file_is_refused_everywhere_and_accepted_with_the_flag(
    project, monkeypatch, capsys, script_main
):
    workdir = str(project / "runs" / "task")
    monkeypatch.chdir(project)
    recorded = load_assets(workdir, 4)["task_origin"]["sha256"]
    with edited(project / "tasks" / "parity.py", "# the same generator, other bytes\n") as digest:
        assert one_refusal(capsys, script_main("eval")([workdir])).endswith(
            f"(sha256 {recorded[:12]} recorded, {digest[:12]} now): {FIX} "
            "(Python: accept_changed_data=True)"
        )
        one_refusal(capsys, generate_main([workdir, "--input", "1 0"]))
        one_refusal(capsys, interp_main([workdir, "heads"]))
        one_refusal(capsys, resume_cli(script_main, project, "task"))
        for call in (tfmjax.load, tfmjax.evaluate):
            with pytest.raises(CheckpointError, match=REFUSED):
                call(workdir)

        accepted = "; accepted"
        assert script_main("eval")([workdir, "--accept-changed-data"]) == 0
        assert accepted in capsys.readouterr().err
        assert generate_main([workdir, "--input", "1 0", "--accept-changed-data"]) == 0
        assert capsys.readouterr().out.startswith("1 0 -> ")
        assert analyses.load_run(workdir, accept_changed_data=True).step == 4
        assert tfmjax.load(workdir, accept_changed_data=True).step == 4
        assert resume_cli(script_main, project, "task", "--accept-changed-data") == 0
        assert accepted in capsys.readouterr().err
        # the resumed run's checkpoints record the file as it is now
        resumed = project / "runs" / "task-resumed"
        assert load_assets(resumed, 8)["task_origin"]["sha256"] == digest
        assert load_assets(resumed, 4)["task_origin"]["sha256"] == recorded
    assert script_main("eval")([workdir]) == 0  # restored: the same bytes again


def test_eval_py_names_the_steps_there_are_for_a_step_that_is_not(project, capsys, script_main):
    checkpoints = project / "runs" / "task" / "checkpoints"
    assert script_main("eval")([str(checkpoints / "999")]) == 2
    assert capsys.readouterr().err == (
        f"error: {checkpoints} holds no checkpoint step 999; its steps: 4 (give one, or the "
        "workdir for the newest)\n"
    )


def test_an_edited_text_file_is_refused_and_accepted_with_the_flag(
    project, monkeypatch, capsys, script_main
):
    workdir = str(project / "runs" / "text")
    monkeypatch.chdir(project)
    with edited(project / "corpus.txt", "80: the lazy dog.\n") as digest:  # known characters
        one_refusal(capsys, script_main("eval")([workdir]))
        one_refusal(capsys, resume_cli(script_main, project, "text"))
        with pytest.raises(CheckpointError, match=REFUSED):
            tfmjax.load(workdir)
        # generation reads only the tokenizer the checkpoint holds, never the text
        assert generate_main([workdir, "--input", "the", "--max-new-tokens", "3"]) == 0
        capsys.readouterr()
        raw = experiment(TEXT_TASK, Path(workdir), vocab=48, params=RUNS["text"][2])
        with pytest.raises(CheckpointError, match=REFUSED):
            tfmjax.fit(tfmjax.experiment(raw), progress=False)
        result = tfmjax.fit(tfmjax.experiment(raw), progress=False, accept_changed_data=True)
        assert result["step"] == 4  # finished already: accepted, nothing to do
        assert tfmjax.evaluate(workdir, accept_changed_data=True)["step"] == 4
        assert load_assets(workdir, 4)["task_origin"]["sha256"] != digest  # nothing rewritten
