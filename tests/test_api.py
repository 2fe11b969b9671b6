"""The Python API (``tfmjax.*``): experiments from files or dicts, the face's lazy names,
and an imported Hugging Face model through ``load`` and ``generate_ids`` (against the ids
transformers generated, committed as goldens). The README's cells: test_readme_python.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tfmjax
from tfmjax.hf.cli import main as hf_main

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = ROOT / "tests" / "hf" / "goldens"


def test_experiment_overrides_as_a_dict_or_strings(tmp_path):
    config = ROOT / "configs" / "reverse.toml"
    as_strings = tfmjax.experiment(
        config, ["train.steps=40", "optim.schedule='linear'", "data.task_params.max_len=6"]
    )
    as_dict = tfmjax.experiment(
        config,
        {"train.steps": 40, "optim.schedule": "linear", "data.task_params": {"max_len": 6}},
    )
    assert as_dict == as_strings and as_dict.name == "reverse"
    assert (as_dict.train.steps, as_dict.optim.schedule) == (40, "linear")
    assert as_dict.data.task_params["max_len"] == 6

    raw = {"model": {"preset": "tiny-gpt2", "d_model": 32}, "data": {"task": "sort"}}
    from_dict = tfmjax.experiment(raw, {"model.num_layers": 1}, name="mine")
    assert (from_dict.workdir, from_dict.model.d_model, from_dict.model.num_layers) == (
        "runs/mine",
        32,
        1,
    )
    # as on the command line: a preset override drops the dict's other [model] keys
    preset = tfmjax.experiment(raw, {"model.preset": "tiny-llama"})
    assert preset.model == tfmjax.experiment({"model": {"preset": "tiny-llama"}}).model
    with pytest.raises(ValueError, match="must be a dict or a list"):
        tfmjax.experiment(config, "train.steps=40")


def test_import_tfmjax_is_light_and_hands_on_the_api():
    code = (
        "import sys, tfmjax; light = 'jax' not in sys.modules; "
        "import tfmjax.api as api; print(light, tfmjax.fit is api.fit, tfmjax.load is api.load)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfmjax.nope  # noqa: B018


def test_an_imported_model_continues_ids_as_transformers_does(tmp_path):
    work = tmp_path / "gpt2"
    assert hf_main(["import", str(GOLDENS / "gpt2"), str(work)]) == 0
    m = tfmjax.load(work)
    assert (m.step, m.tokenizer, m.source) == (0, None, None)
    data = np.load(GOLDENS / "gpt2" / "expected.npz")
    prompt = [int(t) for t in data["prompts"][0] if t]
    (row,) = tfmjax.generate_ids(m, [prompt], max_new_tokens=16)
    assert row == data["generated"][0].tolist()
    for call, says in (
        (lambda: tfmjax.generate_text(m, "hi"), "no tokenizer.json beside the weights"),
        (lambda: tfmjax.evaluate(m), "holds an imported model"),
    ):
        with pytest.raises(ValueError, match=says) as err:
            call()
        assert "\n" not in str(err.value)


def _tokenizer_fixture():
    """tests/hf/tokenizer_fixture.py (tests/ is no package): tiny models with a tokenizer."""
    path = ROOT / "tests" / "hf" / "tokenizer_fixture.py"
    spec = importlib.util.spec_from_file_location("tokenizer_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_imported_model_with_its_tokenizer_continues_text_as_the_generate_cli_does(
    tmp_path, capsys
):
    from tfmjax.generate import main as generate_main

    work = tmp_path / "llama"
    assert (
        hf_main(["import", str(_tokenizer_fixture().model_dir("llama", tmp_path)), str(work)]) == 0
    )
    m = tfmjax.load(work)
    prompts = ["the dog sat on", "a bird"]
    assert m.source is None and m.tokenizer.encode(prompts[0])
    texts = tfmjax.generate_text(m, prompts, max_new_tokens=6)
    capsys.readouterr()
    args = [str(work), "--input", prompts[0], "--input", prompts[1], "--max-new-tokens", "6"]
    assert generate_main(args) == 0
    assert capsys.readouterr().out == "".join(
        f"{p} -> {t}\n" for p, t in zip(prompts, texts, strict=True)
    )


def test_a_language_model_continues_text_as_the_generate_cli_does(tmp_path, capsys):
    """configs/shakespeare_char.toml made tiny and trained 2 steps: ``generate_text`` samples
    the continuation ``python -m tfmjax.generate WORKDIR --input TEXT`` prints (the task's
    top-k sampling, seed 0), and ``evaluate`` reports bits per character."""
    from tfmjax.generate import main as generate_main

    exp = tfmjax.experiment(
        ROOT / "configs" / "shakespeare_char.toml",
        {"model": {"d_model": 32, "num_layers": 1, "d_ff": 64},
         "optim.warmup_steps": 1, "data.eval_examples": 12,
         "data.task_params": {"sample_tokens": 12, "samples": 1},
         "train": {"steps": 2, "eval_every": 2, "checkpoint_every": 2, "log_every": 1,
                   "workdir": str(tmp_path / "lm")}},
    )  # fmt: skip
    assert tfmjax.fit(exp, progress=False)["step"] == 2
    m = tfmjax.load(tmp_path / "lm")
    assert m.tokenizer.encode("ROMEO:") and m.source is not None
    prompts = ["ROMEO:", "JULIET:"]
    texts = tfmjax.generate_text(m, prompts)  # what follows each (the CLI prints both)
    capsys.readouterr()
    assert generate_main([str(tmp_path / "lm"), "--input", prompts[0], "--input", prompts[1]]) == 0
    assert capsys.readouterr().out == "".join(
        f"{p}{t}\n" for p, t in zip(prompts, texts, strict=True)
    )
    report = tfmjax.evaluate(m)
    assert report["step"] == 2 and report["bits_per_char"] > 0
