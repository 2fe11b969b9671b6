"""Training an image classifier (model.input = "patches") on the digits: it beats chance,
its checkpoint evaluates to a test accuracy, a resume is bit-exact, the interp patterns
label positions as patches, DLA reads the class head, and the interp commands built on token
sequences refuse a patch model in one line."""

import os

import pytest

from tfmjax.checkpoint import load_for_inference, params_hash
from tfmjax.config import ConfigError, from_dict
from tfmjax.evaluation.report import evaluate_checkpoint, format_report
from tfmjax.interp import analyses
from tfmjax.interp.cli import _side_labels
from tfmjax.interp.cli import main as interp_main
from tfmjax.train.loop import train
from tfmjax.train.run import build_run


def experiment(workdir, steps=40, **model):
    return from_dict(
        {
            "model": {
                "preset": "tiny-vit",
                "d_model": 32,
                "num_heads": 2,
                "d_ff": 64,
                "num_layers": 1,
                **model,
            },
            "optim": {"learning_rate": 3e-3, "warmup_steps": 5, "schedule_steps": 40},
            "data": {"task": "digits", "batch_size": 32, "eval_examples": 360},
            "train": {
                "steps": steps,
                "log_every": 10,
                "eval_every": 20,
                "checkpoint_every": 20,
                "best_metric": "accuracy",
                "workdir": str(workdir),
            },
        },
        name="digits",
    )


def run(exp, **kw):
    return train(exp, progress=False, plot=False, stream=open(os.devnull, "w"), **kw)


def test_a_tiny_run_beats_chance_and_its_checkpoint_reports_accuracy(tmp_path, capsys):
    exp = experiment(tmp_path / "run")
    out = run(exp)
    assert out["step"] == 40
    report = evaluate_checkpoint(tmp_path / "run")
    assert report["num_examples"] == 360 and "accuracy" in report["metric_names"]
    # chance (the most frequent training class) is ~0.1; 40 steps reach 0.29 (seed 0)
    assert report["accuracy"] > 0.2 > report["chance_accuracy"] > 0.05
    text = format_report(report)
    assert "accuracy" in text and "class-token argmax" in text
    # resumed from step 20, the run ends with the same params as the uninterrupted one
    config, params, _ = load_for_inference(tmp_path / "run")
    half = experiment(tmp_path / "half", steps=20)
    run(half)
    run(experiment(tmp_path / "half", steps=40))
    assert params_hash(load_for_inference(tmp_path / "half")[1]) == params_hash(params)
    # the interp patterns label the class token and the patches
    assert interp_main([str(tmp_path / "run"), "patterns", "--out", str(tmp_path / "i")]) == 0
    assert (tmp_path / "i" / "encoder_blocks_0_attn.png").is_file()
    loaded = analyses.load_run(tmp_path / "run", "patterns")
    row = {k: v[:1] for k, v in loaded.batch(2).items()}
    labels = _side_labels(loaded, row)["encoder"]
    assert labels[:2] == ["cls", "patch 0 (r0,c0)"] and labels[-1] == "patch 15 (r3,c3)"
    # direct logit attribution reads the class head; the token-sequence analyses refuse
    out = ["--out", str(tmp_path / "i")]
    assert interp_main([str(tmp_path / "run"), "dla", *out]) == 0
    assert "answer logit" in capsys.readouterr().out
    for command in ("heads", "patch", "ablate", "sae", "phase"):
        assert interp_main([str(tmp_path / "run"), command, *out]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{command}" in err, err
        assert "a patch (image) model (model.input='patches') reads pixels, not tokens" in err


def test_a_token_task_or_a_token_model_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="serves seq2seq, prompt_answer batches") as err:
        build_run(from_dict({**experiment(tmp_path).to_dict(), "data": {"task": "reverse"}}))
    assert "\n" not in str(err.value)
    raw = experiment(tmp_path).to_dict()
    raw["model"] = {"family": "decoder_only", "vocab_size": 16}
    raw["train"]["best_metric"] = "exact_match"
    with pytest.raises(ConfigError, match="serves images batches"):
        build_run(from_dict(raw))
    raw = experiment(tmp_path).to_dict()
    raw["train"]["best_metric"] = "exact_match"
    with pytest.raises(ConfigError, match="train.best_metric='exact_match' is not measured"):
        build_run(from_dict(raw))
