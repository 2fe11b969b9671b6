"""``eval.py --text`` and ``python -m tfmjax.interp --input`` on imported models, which have
no task: perplexity on a person's text, and analyses of that text labelled with the model's
own tokens (models and tokenizers of ``tokenizer_fixture.py``)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax.hf.cli import main as hf_main
from tfmjax.interp.cli import main as interp_main

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIXTURE = load("tokenizer_fixture", HERE / "tokenizer_fixture.py")
EVAL = load("eval_cli", ROOT / "eval.py")


def imported(case: str, root: Path, *, tokenizer: bool = True) -> Path:
    work = root / "work"
    directory = FIXTURE.model_dir(case, root, tokenizer=tokenizer)
    assert hf_main(["import", str(directory), str(work)]) == 0
    return work


def reference_nll(case: str, ids: list[int], width: int) -> tuple[float, int]:
    """Summed NLL of ``ids`` scored window by window, each window alone behind BOS: NumPy
    log-softmax over the logits of ``model.apply`` on that window."""
    from tfmjax import hf
    from tfmjax.models import build

    cfg, params = hf.load(FIXTURE.GOLDENS / FIXTURE.CASES[case]["model"])
    apply = jax.jit(build(cfg).apply)
    if ids[0] == cfg.bos_id:
        ids = ids[1:]
    total = 0.0
    for start in range(0, len(ids), width):
        window = np.asarray([ids[start : start + width]], np.int32)
        logits = np.asarray(apply(params, {"tokens": window}), np.float64)[0]
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.sum(np.exp(logits - top), -1, keepdims=True))
        total -= float(np.sum(logp[np.arange(window.shape[1]), window[0]]))
    return total, len(ids)


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_eval_text_gives_the_perplexity_of_the_text_window_by_window(case, tmp_path, capsys):
    work = imported(case, tmp_path)
    text = FIXTURE.TEXT  # several windows of 32 tokens, the last one short
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    out = tmp_path / "report.json"
    assert EVAL.main([str(work), "--text", str(path), "--batch-size", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    ids = FIXTURE.train_tokenizer(case).encode(text).ids
    nll, tokens = reference_nll(case, ids, 32)
    assert tokens > 2 * 32 and tokens % 32 and report["tokens"] == tokens
    assert report["num_examples"] == math.ceil(tokens / 32)
    np.testing.assert_allclose(report["loss"], nll / tokens, rtol=1e-5)
    np.testing.assert_allclose(report["perplexity"], math.exp(nll / tokens), rtol=1e-5)
    np.testing.assert_allclose(report["bits_per_char"], nll / math.log(2) / len(text), rtol=1e-5)
    assert "perplexity" in capsys.readouterr().out


def test_eval_of_an_imported_model_without_text_says_what_to_pass(tmp_path, capsys):
    work = imported("gpt2", tmp_path)
    assert EVAL.main([str(work)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --text FILE" in err
    bare = imported("gpt2", tmp_path / "bare", tokenizer=False)
    (tmp_path / "t.txt").write_text("the cat")
    assert EVAL.main([str(bare), "--text", str(tmp_path / "t.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer.json beside the weights" in err


def test_a_model_imported_before_the_assets_held_it_is_still_known_as_imported(tmp_path, capsys):
    """An older import: no ``hf`` asset, only ``WORKDIR/hf_config.json``."""
    from tfmjax import hf
    from tfmjax.checkpoint import Checkpointer
    from tfmjax.config import Experiment, TrainConfig

    work = tmp_path / "old"
    directory = FIXTURE.model_dir("gpt2", tmp_path)
    cfg, params = hf.load(directory)
    train = TrainConfig(workdir=str(work.absolute()))
    work.mkdir()
    (work / "hf_config.json").write_text((directory / "config.json").read_text())
    with Checkpointer(work, keep=1) as ckpt:
        ckpt.save(0, {"params": params}, config=Experiment(name="old", model=cfg, train=train))
    assert EVAL.main([str(work)]) == 2
    assert "pass --text FILE" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("the cat")
    assert EVAL.main([str(work), "--text", str(tmp_path / "t.txt")]) == 2
    assert "import again" in capsys.readouterr().err


def test_interp_patterns_and_dla_read_the_text_and_label_it_with_its_tokens(tmp_path, capsys):
    work = imported("gpt2", tmp_path)
    text = "the dog sat on the mat"
    tokenizer = FIXTURE.train_tokenizer("gpt2")
    ids = tokenizer.encode(text).ids
    labels = [tokenizer.decode([i], skip_special_tokens=False) for i in [95, *ids[:-1]]]
    assert labels[0] == "<|endoftext|>"  # BOS, then the inputs
    out = tmp_path / "interp"
    assert interp_main([str(work), "patterns", "--input", text, "--out", str(out)]) == 0
    report = json.loads((out / "interp.json").read_text())["patterns"]
    assert report["files"] == ["decoder_blocks_0_attn.png", "decoder_blocks_1_attn.png"]
    from tfmjax.interp import analyses
    from tfmjax.interp.cli import _side_labels

    run = analyses.load_run(work, "patterns", text)
    batch = run.batch(64)
    assert batch["tokens"].tolist() == [ids]
    assert _side_labels(run, batch)["decoder"] == labels
    assert "".join(labels[1:]) + tokenizer.decode([ids[-1]]) == text  # the text's own pieces
    assert interp_main([str(work), "dla", "--ids", " ".join(map(str, ids)), "--out", str(out)]) == 0
    dla = json.loads((out / "interp.json").read_text())["dla"]
    want = analyses.dla_report(run, batch)
    assert dla["values"] == want["values"] and len(dla["values"]) == len(dla["names"])
    # the logits the attribution explains are the model's own on this text
    logits = jax.jit(run.model.apply)(run.params, {k: np.asarray(v) for k, v in batch.items()})
    own = float(np.mean(np.take_along_axis(np.asarray(logits)[0], np.asarray(ids)[:, None], 1)))
    np.testing.assert_allclose(dla["answer_logit"], own, atol=1e-3)


def test_interp_of_an_imported_model_refuses_what_needs_a_task(tmp_path, capsys):
    work = imported("gpt2", tmp_path)
    out = str(tmp_path / "interp")
    assert interp_main([str(work), "patterns", "--out", out]) == 2
    assert 'pass --input "some text"' in capsys.readouterr().err
    assert interp_main([str(work), "patch", "--input", "the cat", "--out", out]) == 2
    assert "interp patch needs a task" in capsys.readouterr().err
    assert interp_main([str(work), "patterns", "--input", "the cat", "--example", "1"]) == 2
    assert "--example 1 is not one of the 1 rows analysed" in capsys.readouterr().err
    assert interp_main([str(work), "heads", "--out", out]) == 0
    report = json.loads((tmp_path / "interp" / "interp.json").read_text())["heads"]
    assert np.asarray(report["decoder"]["induction"]).shape == (2, 4)
