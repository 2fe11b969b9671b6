"""Training on text: a language model and a masked LM on the Shakespeare corpus, bit-exact
resume, and the tokenizer carried by the checkpoint into eval and generation."""

import io
import json
import math
import os

import jax
import pytest

from tfmjax.checkpoint import load_assets, load_for_inference, params_hash
from tfmjax.config import ConfigError, from_dict
from tfmjax.data.vocab import EOS_ID
from tfmjax.decode import Greedy
from tfmjax.evaluation.report import evaluate_checkpoint, format_report
from tfmjax.generate import continue_text
from tfmjax.generate import main as generate_main
from tfmjax.models import build
from tfmjax.reporting.console import format_record
from tfmjax.reporting.metrics_log import deterministic_part, read_records
from tfmjax.train.loop import train


def experiment(workdir, family="decoder_only", steps=60, **data):
    return from_dict(
        {
            "model": {
                "family": family,
                "vocab_size": 96,
                "d_model": 32,
                "num_heads": 2,
                "d_ff": 64,
                "num_layers": 1,
                "max_len": 32,
                "position": "learned",
            },
            "optim": {"learning_rate": 1e-2, "warmup_steps": 5},
            "data": {
                "task": "shakespeare",
                "task_params": {"tokenizer": "char", "context": 32, "sample_tokens": 8, **data},
                "batch_size": 8,
                "eval_examples": 16,
            },
            "train": {
                "steps": steps,
                "log_every": 6,
                "eval_every": 12 if steps < 60 else 10,
                "checkpoint_every": 4 if steps < 60 else 30,
                "best_metric": "loss",
                "workdir": str(workdir),
            },
        },
        name="text",
    )


def run(exp, **kw):
    return train(exp, progress=False, plot=False, stream=open(os.devnull, "w"), **kw)


def exp_model(workdir):
    return from_dict(load_for_inference(workdir)[0]).model


def params_of(workdir):
    return load_for_inference(workdir)[1]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lm")
    result = run(experiment(workdir))
    return workdir, result


def test_a_tiny_language_model_lowers_the_validation_loss(lm_run):
    workdir, result = lm_run
    evals = [r for r in read_records(workdir / "metrics.jsonl") if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20, 30, 40, 50, 60]
    assert evals[0]["loss"] < math.log(96)
    assert evals[-1]["loss"] < evals[0]["loss"] - 0.3
    # bits per character: the NLL in bits over the characters (one token each here)
    assert evals[-1]["bits_per_char"] == pytest.approx(evals[-1]["loss"] / math.log(2), rel=1e-6)
    samples = evals[-1]["samples"]
    assert len(samples) == 3 and all(len(s["continuation"]) == 8 for s in samples)
    assert result["eval"]["bits_per_char"] == evals[-1]["bits_per_char"]
    # a language model's train lines show loss, perplexity and accuracy: no exact match,
    # which a window of text never reaches (it printed "exact 0.0000")
    trains = [r for r in read_records(workdir / "metrics.jsonl") if r["split"] == "train"]
    assert trains and all("exact_match" not in r and "perplexity" in r for r in trains)
    assert "exact" not in format_record(trains[-1])


def test_checkpoint_carries_the_tokenizer_into_eval_and_generate(lm_run, capsys):
    workdir, result = lm_run
    _, _, step = load_for_inference(workdir)
    tokenizer = load_assets(workdir, step)["tokenizer"]
    assert tokenizer["kind"] == "char" and "R" in tokenizer["symbols"]

    report = evaluate_checkpoint(workdir)
    for key in ("loss", "bits_per_char", "token_accuracy", "perplexity"):
        assert report[key] == pytest.approx(result["eval"][key], rel=1e-6)
    text = format_report(report)
    assert "bits_per_char" in text and "samples" in text

    assert generate_main([str(workdir), "--input", "ROMEO:", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out.rstrip("\n")) >= len("ROMEO:")
    # the same seed samples the same text; greedy is available too
    assert generate_main([str(workdir), "--input", "ROMEO:", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out == out
    assert generate_main([str(workdir), "--input", "To be", "--decode", "greedy"]) == 0
    assert capsys.readouterr().out.startswith("To be")

    # past model.max_len=32: the window slides (40 new ids, or fewer ending at EOS)
    new = continue_text(
        build(exp_model(workdir)), params_of(workdir), [5, 6], Greedy(), 40, jax.random.key(0)
    )
    assert len(new) == 40 or new[-1] == EOS_ID

    assert generate_main([str(workdir), "--input", "caf\u00e9"]) == 2
    err = capsys.readouterr().err
    assert "character '\u00e9' is not in the tokenizer" in err and len(err.splitlines()) == 1
    # an input that fills the context: cropped to the window's last half, or (--no-crop) refused
    assert generate_main([str(workdir), "--input", "x" * 32, "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("x" * 32) and len(out.rstrip("\n")) > 32
    assert err.startswith("warning: dropped the first 16 of the longest input's 32 tokens")
    assert len(err.splitlines()) == 1
    assert generate_main([str(workdir), "--input", "x" * 32, "--no-crop"]) == 2
    assert "fill the model's model.max_len=32" in capsys.readouterr().err


@pytest.mark.slow
def test_text_resume_is_bit_exact(tmp_path):
    """SIGTERM at step 5 then a rerun ends with the params and records of a straight run."""
    straight = run(experiment(tmp_path / "a", steps=12))
    assert straight["step"] == 12

    def stop_at_5(done):
        if done == 5:
            os.kill(os.getpid(), 15)

    first = run(experiment(tmp_path / "b", steps=12), on_step=stop_at_5)
    assert first["stopped"] and first["step"] == 5
    out = io.StringIO()
    train(experiment(tmp_path / "b", steps=12), progress=False, plot=False, stream=out)
    assert "resumed from checkpoint step 5" in out.getvalue()
    _, params_a, _ = load_for_inference(tmp_path / "a")
    _, params_b, _ = load_for_inference(tmp_path / "b")
    assert params_hash(params_a) == params_hash(params_b)
    records = [
        [deterministic_part(r) for r in read_records(tmp_path / d / "metrics.jsonl")] for d in "ab"
    ]
    assert records[0] == records[1]
    assert any("samples" in r for r in records[0])


def test_a_tiny_masked_lm_learns_and_reports_its_baseline(tmp_path):
    exp = experiment(tmp_path, family="encoder_only", steps=40)
    result = run(exp)
    evals = [r for r in read_records(tmp_path / "metrics.jsonl") if r["split"] == "eval"]
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert 0.0 < evals[-1]["unigram_accuracy"] < 0.3  # the space: about 1 character in 6
    assert "bits_per_char" not in evals[-1]
    fills = evals[-1]["samples"]
    assert fills and "<mask>" in "".join(f["input"] for f in fills)
    report = evaluate_checkpoint(tmp_path)
    assert report["token_accuracy"] == pytest.approx(result["eval"]["token_accuracy"])
    assert "fill-ins" in format_report(report)
    json.dumps(report)  # eval.json is plain JSON


def test_text_configs_refuse_what_does_not_fit(tmp_path):
    with pytest.raises(ConfigError, match="trains as a masked LM, on text only"):
        base = experiment(tmp_path).to_dict()
        base["model"]["family"] = "encoder_only"
        base["data"].update(task="copy", task_params={})
        run(from_dict(base))
    with pytest.raises(ConfigError, match="train.best_metric='exact_match' is not measured"):
        base = experiment(tmp_path).to_dict()
        base["train"]["best_metric"] = "exact_match"
        run(from_dict(base))
    with pytest.raises(ConfigError, match="model.vocab_size=40 is smaller than the vocabulary"):
        base = experiment(tmp_path).to_dict()
        base["model"]["vocab_size"] = 40
        run(from_dict(base))
