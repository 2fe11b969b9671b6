"""Greedy decoding agrees with teacher forcing; eval.py reports every field from a checkpoint."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.checkpoint import load_for_inference
from tfmjax.config import ModelConfig, from_dict
from tfmjax.data import EOS_ID, PAD_ID, make_task
from tfmjax.decode import BeamSearch, Greedy, TopK, generate
from tfmjax.evaluation.evaluator import Evaluator, ids_to_text
from tfmjax.evaluation.report import evaluate_checkpoint, format_report
from tfmjax.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
TASK = make_task("reverse", num_symbols=5, max_len=5)
HANG_S = 600  # a hang guard for the eval.py runs, not a speed limit


def _teacher_forced_argmax(model, params, batch, family, predictions):
    """Feed the greedy answers back as targets; the argmax must reproduce them."""
    if family == "encoder_decoder":
        forced = {"inputs": batch["inputs"], "targets": predictions}
        return np.asarray(jnp.argmax(jax.jit(model.apply)(params, forced), -1))
    tokens = np.array(batch["tokens"])
    W = tokens.shape[1]
    for i, p in enumerate(batch["prompt_len"]):
        n = min(predictions.shape[1], W - p)
        tokens[i, p : p + n] = predictions[i, :n]
        tokens[i, p + n :] = PAD_ID
    logits = np.asarray(
        jnp.argmax(jax.jit(model.apply)(params, {"tokens": jnp.asarray(tokens)}), -1)
    )
    idx = np.minimum(batch["prompt_len"][:, None] + np.arange(predictions.shape[1]), W - 1)
    return np.take_along_axis(logits, idx, axis=1)


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_eval_decode_equals_teacher_forced_argmax(family):
    """The evaluator's (cached, greedy) answers reproduce themselves under teacher forcing."""
    cfg = ModelConfig(
        family=family,
        vocab_size=16,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        tie_embeddings=False,
    )
    evaluator = Evaluator(cfg, TASK, batch_size=8, num_examples=8)
    batch = evaluator.batches[0]
    # the model's own init: random_params' wider logits make it emit PAD (id 0) mid-answer,
    # which the teacher-forced oracle below would read as padding
    params = evaluator.model.init(jax.random.key(1), batch)
    m = evaluator.max_new_tokens
    predictions = evaluator.predict(params, evaluator.prompts[0])
    assert predictions.shape == (8, m)
    again = _teacher_forced_argmax(evaluator.model, params, batch, family, predictions)
    for row, forced in zip(predictions, again, strict=True):
        # up to and including the first EOS (after it generation writes PAD)
        end = int(np.argmax(row == EOS_ID)) + 1 if (row == EOS_ID).any() else len(row)
        np.testing.assert_array_equal(row[:end], forced[:end])
        assert (row[end:] == PAD_ID).all()
    targets, mask = evaluator.model.eval_answers(batch, m)
    assert int(mask.sum()) == int(
        (batch["targets"] != 0).sum() if family == "encoder_decoder" else batch["loss_mask"].sum()
    )


def test_eval_on_its_own_targets_is_exact(random_params):
    """Exact-match is 1 when the 'decoder' emits the targets, and drops when one token differs."""
    cfg = ModelConfig(
        family="decoder_only", vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_layers=1
    )
    evaluator = Evaluator(cfg, TASK, batch_size=8, num_examples=8)
    batch = evaluator.batches[0]
    targets, mask = evaluator.model.eval_answers(batch, evaluator.max_new_tokens)
    wrong = targets.copy()
    wrong[0, 0] = (wrong[0, 0] + 1) % 16
    params = random_params(evaluator.model)
    for predicted, want in ((targets, 1.0), (wrong, 7 / 8)):
        evaluator.predict = lambda params, prompts, rng=None, p=predicted: p
        metrics, rows = evaluator(params, num_rows=8)
        assert metrics["exact_match"] == want
        assert [r["correct"] for r in rows] == [
            bool(x) for x in np.all((predicted == targets) | ~mask, axis=1)
        ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("eval_run")
    exp = from_dict(
        {
            "model": {
                "family": "decoder_only",
                "vocab_size": 16,
                "d_model": 16,
                "num_heads": 2,
                "d_ff": 32,
                "num_layers": 1,
                "position": "rope",
            },
            "optim": {"warmup_steps": 1},
            "data": {
                "task": "reverse",
                "task_params": {"num_symbols": 5, "max_len": 5},
                "batch_size": 8,
                "eval_examples": 8,
            },
            "train": {
                "steps": 4,
                "log_every": 2,
                "eval_every": 4,
                "checkpoint_every": 2,
                "workdir": str(workdir),
            },
        },
        name="evaltest",
    )
    train(exp, progress=False, plot=False, stream=open(os.devnull, "w"))
    return workdir


def test_report_from_checkpoint_has_every_field(trained):
    """A report of 10 length-split examples in batches of 4 (the last one cut to 2 rows): its
    loss and token accuracy are the NumPy teacher-forced NLL and argmax accuracy of those 10
    rows, from the checkpoint's params."""
    report = evaluate_checkpoint(
        trained / "checkpoints" / "4", split="length", num_examples=10, batch_size=4, num_rows=3
    )
    assert report["step"] == 4 and report["split"] == "length" and report["num_examples"] == 10
    config, params, _ = load_for_inference(trained / "checkpoints" / "4")
    evaluator = Evaluator(
        from_dict(config).model, TASK, batch_size=4, num_examples=10, split="length"
    )
    nll = correct = tokens = 0.0
    for batch, rows in zip(evaluator.batches, (4, 4, 2), strict=True):
        logits = np.asarray(jax.jit(evaluator.model.apply)(params, batch), np.float64)[:rows]
        targets, mask = batch["tokens"][:rows], batch["loss_mask"][:rows]  # decoder-only
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        nll -= (np.take_along_axis(logp, targets[..., None], -1)[..., 0] * mask).sum()
        correct += ((logits.argmax(-1) == targets) * mask).sum()
        tokens += mask.sum()
    assert report["loss"] == pytest.approx(nll / tokens, rel=1e-5)
    assert report["token_accuracy"] == pytest.approx(correct / tokens, rel=1e-6)
    hits = report["exact_match"] * 10  # a share of the 10 examples
    assert 0 <= round(hits) <= 10 and hits == pytest.approx(round(hits), abs=1e-9)
    assert report["perplexity"] == pytest.approx(np.exp(report["loss"]))
    assert len(report["examples"]) == 3
    assert set(report["examples"][0]) == {"input", "prediction", "target", "correct"}
    assert "exact_match" in format_report(report)


def _eval_cli(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "eval.py"), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_eval_cli_writes_eval_json(trained):
    proc = _eval_cli(trained, "--num-examples", 6)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((trained / "eval.json").read_text())
    expected = {
        "checkpoint",
        "workdir",
        "step",
        "experiment",
        "family",
        "task",
        "split",
        "decode",
        "num_examples",
        "loss",
        "perplexity",
        "token_accuracy",
        "exact_match",
        "examples",
        "timing",
    }
    assert expected <= set(report)
    assert report["num_examples"] == 6 and report["experiment"] == "evaltest"
    assert "exact_match" in proc.stdout


def test_eval_cli_missing_checkpoint_exit_2(tmp_path):
    proc = _eval_cli(tmp_path / "nothing here")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def _decoded_texts(workdir, strategy, seed: int, n: int) -> list[str]:
    """The first ``n`` eval answers of the checkpoint, decoded by a direct ``generate`` call
    (batch 0's key is ``fold_in(key(seed), 0)``, as the Evaluator documents)."""
    config, params, _ = load_for_inference(workdir)
    evaluator = Evaluator(from_dict(config).model, TASK, batch_size=8, num_examples=n)
    rng = jax.random.fold_in(jax.random.key(seed), 0)
    out = generate(
        evaluator.model, params, evaluator.prompts[0], strategy, evaluator.max_new_tokens, rng=rng
    )
    return [ids_to_text(TASK.vocab, row) for row in np.asarray(out.tokens)[:n]]


@pytest.mark.parametrize(
    "flags, strategy, seed",
    [
        (("--decode", "beam", "--beam-size", "3"), BeamSearch(3, alpha=0.6), 0),
        (("--decode", "sample", "--top-k", "2", "--seed", "1"), TopK(2), 1),
    ],
)
def test_eval_cli_decode_strategies(trained, tmp_path, flags, strategy, seed):
    """eval.py --decode beam / sample decodes with that strategy: the report names it, and its
    answers are a direct ``generate`` call's with the same strategy (and seed), which differ
    from the greedy answers on these examples (so a greedy report could not pass)."""
    out = tmp_path / "report.json"
    proc = _eval_cli(trained, "--num-examples", 8, "--rows", 8, "--out", out, *flags)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["decode"] == repr(strategy) and 0.0 <= report["exact_match"] <= 1.0
    predictions = [row["prediction"] for row in report["examples"]]
    assert predictions == _decoded_texts(trained, strategy, seed, 8)
    assert predictions != _decoded_texts(trained, Greedy(), seed, 8)


def test_eval_cli_bad_decode_options_exit_2(trained):
    proc = _eval_cli(trained, "--decode", "sample", "--top-k", "2", "--top-p", "0.5")
    assert proc.returncode == 2 and "cannot be combined" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_eval_cli_relative_workdir(trained):
    """`python eval.py runs/NAME` from the directory above: Orbax needs absolute paths inside."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval.py"),
            trained.name,
            "--num-examples",
            "2",
            "--out",
            str(trained / "rel.json"),
        ],
        cwd=trained.parent,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((trained / "rel.json").read_text())["step"] == 4


def test_eval_reports_the_step_it_loaded_when_the_newest_is_corrupt(trained, tmp_path):
    """The newest step is corrupt: eval falls back to step 2 and says so (not step 4)."""
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    data_files = [f for f in (workdir / "checkpoints" / "4" / "state").rglob("*") if f.is_file()]
    biggest = max(data_files, key=lambda f: f.stat().st_size)  # the arrays' data file
    data = bytearray(biggest.read_bytes())
    for i in range(len(data) // 4, len(data), max(len(data) // 64, 1)):
        data[i] ^= 0xFF
    biggest.write_bytes(bytes(data))
    (workdir / "eval.json").unlink(missing_ok=True)  # reports of earlier tests
    shutil.rmtree(workdir / "eval", ignore_errors=True)
    proc = _eval_cli(workdir, "--num-examples", 2)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((workdir / "eval" / "step_2.json").read_text())["step"] == 2
    assert json.loads((workdir / "eval.json").read_text())["step"] == 2
    assert not (workdir / "eval" / "step_4.json").exists()
    assert "(step 2)" in proc.stdout and "checkpoint step 4 is corrupt" in proc.stderr


@pytest.mark.slow
def test_evaluating_an_older_step_keeps_the_newest_report(trained, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    assert _eval_cli(workdir, "--num-examples", 2).returncode == 0
    newest = json.loads((workdir / "eval.json").read_text())
    proc = _eval_cli(workdir / "checkpoints" / "2", "--num-examples", 2)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((workdir / "eval.json").read_text()) == newest  # still step 4
    assert newest["step"] == 4
    assert json.loads((workdir / "eval" / "step_2.json").read_text())["step"] == 2
    assert json.loads((workdir / "eval" / "step_4.json").read_text())["step"] == 4
    proc = _eval_cli(workdir, "--num-examples", 2, "--split", "length")
    assert json.loads((workdir / "eval" / "step_4_length.json").read_text())["split"] == "length"
    assert json.loads((workdir / "eval.json").read_text())["split"] == "eval"
