"""``python -m tfmjax.hf import`` / ``export`` and the tools that read the imported checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from tfmjax import hf
from tfmjax.checkpoint import load_for_inference
from tfmjax.generate import main as generate_main
from tfmjax.hf.cli import main

GOLDENS = Path(__file__).parent / "goldens"


def test_import_then_export_gives_back_the_same_tensors(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    assert main(["import", str(GOLDENS / "llama_gqa"), str(work)]) == 0
    assert "checkpoints/0" in capsys.readouterr().out
    config, params, step = load_for_inference(work)
    cfg, want = hf.load(GOLDENS / "llama_gqa")
    assert step == 0 and config["model"] == dataclasses.asdict(cfg)
    np.testing.assert_array_equal(
        params["params"]["decoder"]["layers"]["attention"]["key"]["kernel"],
        want["params"]["decoder"]["layers"]["attention"]["key"]["kernel"],
    )
    assert main(["export", str(work), str(out)]) == 0
    before, after = (load_file(d / "model.safetensors") for d in (GOLDENS / "llama_gqa", out))
    assert sorted(before) == sorted(after)
    assert all(
        after[n].tobytes() == a.tobytes() and after[n].dtype == a.dtype for n, a in before.items()
    )
    raw = hf.read_config(out)
    assert (raw["eos_token_id"], raw["dtype"], raw["architectures"]) == (
        2,
        "float16",
        ["LlamaForCausalLM"],
    )


def test_generate_continues_token_ids_of_an_imported_checkpoint(tmp_path, capsys):
    work = tmp_path / "work"
    assert main(["import", str(GOLDENS / "gpt2"), str(work)]) == 0
    data = np.load(GOLDENS / "gpt2" / "expected.npz")
    prompt = " ".join(str(t) for t in data["prompts"][0] if t)
    capsys.readouterr()
    assert generate_main([str(work), "--ids", prompt, "--max-new-tokens", "16"]) == 0
    got = capsys.readouterr().out.strip().split(" -> ")[1]
    assert got == " ".join(map(str, data["generated"][0]))


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["import", str(tmp_path / "nothing"), str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: ") and "config.json does not exist" in err and err.count("\n") == 1
    )
    work = tmp_path / "work"
    assert main(["import", str(GOLDENS / "gpt2"), str(work)]) == 0
    assert main(["import", str(GOLDENS / "gpt2"), str(work)]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "none"), str(tmp_path / "out")]) == 2


def test_finetune_config_starts_from_the_imported_params(tmp_path):
    import jax
    import optax
    import pytest

    from tfmjax.config import ConfigError, load
    from tfmjax.models import build
    from tfmjax.train.state import create_state, with_params_from

    work = tmp_path / "work"
    assert main(["import", str(GOLDENS / "gpt2"), str(work)]) == 0
    experiment = load(work / "finetune.toml", ["data.task=copy"])
    cfg, want = hf.load(GOLDENS / "gpt2")
    assert experiment.model == cfg and experiment.train.init_from == str(work.absolute())
    model, tx = build(cfg), optax.adam(1e-3)
    state = create_state(model, tx, model.dummy_batch(), 0)
    state, step = with_params_from(state, experiment.train.init_from, tx)
    assert step == 0
    jax.tree.map(np.testing.assert_array_equal, state.params, want)
    other = build(dataclasses.replace(cfg, d_ff=48))
    with pytest.raises(ConfigError, match=r"params do not fit this model.\* config: .*mlp"):
        with_params_from(create_state(other, tx, other.dummy_batch(), 0), str(work), tx)
