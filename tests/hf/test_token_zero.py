"""Token id 0 is a token in Hugging Face vocabularies (GPT-2 ``!``, Llama ``<unk>``, BART
``<s>``, Marian ``</s>``): the ``*_hf_ids`` goldens keep each architecture's own special-token
layout and hold 0 at the start, in the middle and at the end of their inputs.

Compared with the committed goldens (make_goldens.py) and, when torch and transformers are
installed, with the live models: logits (to 1e-4), greedy continuations (exact), a padded
batch against each row alone, BOS never added to an imported model's prompt, and the stop at
the imported EOS (generation_config.json first).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax import hf
from tfmjax.decode import Greedy, generate
from tfmjax.decode.reference import generate_uncached
from tfmjax.models import build

HERE = Path(__file__).parent
GOLDENS = HERE / "goldens"
CASES = ["gpt2_hf_ids", "llama_hf_ids", "bart_hf_ids", "marian_hf_ids"]
CAUSAL = ["gpt2_hf_ids", "llama_hf_ids"]
TOL = 1e-4
HAS_TORCH = all(importlib.util.find_spec(n) is not None for n in ("torch", "transformers"))
live = pytest.mark.skipif(not HAS_TORCH, reason="torch and transformers are not installed")


def make_goldens():
    spec = importlib.util.spec_from_file_location("make_goldens", HERE / "make_goldens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected(case: str) -> dict:
    with np.load(GOLDENS / case / "expected.npz") as data:
        return dict(data)


def rows(case: str, data: dict) -> list[list[int]]:
    """Each prompt as its own id list: cut to ``prompt_lengths`` (causal, no pad id) or to
    the ids before the model's pad id (seq2seq)."""
    if "prompt_lengths" in data:
        return [list(p[:n]) for p, n in zip(data["prompts"], data["prompt_lengths"], strict=True)]
    pad = hf.read_config(GOLDENS / case)["pad_token_id"]
    return [[int(t) for t in p if t != pad] for p in data["prompts"]]


def padded_answer(data: dict) -> np.ndarray:
    return data["generated_padded"] if "generated_padded" in data else data["generated"]


@pytest.mark.parametrize("case", CASES)
def test_the_goldens_hold_token_zero_where_it_is_a_token(case):
    cfg, _ = hf.load(GOLDENS / case)
    data = expected(case)
    assert cfg.pad_id != 0 and not cfg.prompt_bos
    ids = data["input_ids"]
    assert (ids[:, :2] == 0).any() and (ids[:, 3:-1] == 0).any() and (ids[:, -1] == 0).any()
    assert (data["prompts"][:, 0] == 0).any() and (data["prompts"][:, 1:-1] == 0).any()
    assert cfg.pad_id == {"gpt2_hf_ids": None, "llama_hf_ids": None}.get(
        case, hf.read_config(GOLDENS / case)["pad_token_id"]
    )


@pytest.mark.parametrize("case", CAUSAL)
def test_causal_logits_with_token_zero_equal_the_goldens_through_the_padding_default(case):
    """``model.apply({"tokens"})`` with no segment ids: with no pad id, 0 is attended to."""
    cfg, params = hf.load(GOLDENS / case)
    data = expected(case)
    ids = data["input_ids"].astype(np.int32)
    logits = np.asarray(jax.jit(build(cfg).apply)(params, {"tokens": ids[:, 1:]}))
    np.testing.assert_allclose(logits, data["logits"][:, :-1], atol=TOL, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_a_padded_batch_equals_each_prompt_alone_and_the_goldens(case):
    cfg, params = hf.load(GOLDENS / case)
    model, data = build(cfg), expected(case)
    prompts, M = rows(case, data), data["generated"].shape[1]
    assert len({len(p) for p in prompts}) > 1  # the batch really is padded
    batch = np.asarray(generate(model, params, prompts, Greedy(), M, eos_id=None).tokens)
    np.testing.assert_array_equal(batch, padded_answer(data))
    for i, prompt in enumerate(prompts):
        alone = np.asarray(generate(model, params, [prompt], Greedy(), M, eos_id=None).tokens)
        np.testing.assert_array_equal(alone[0], batch[i])
    uncached = generate_uncached(model, params, prompts, M, eos_id=None)
    np.testing.assert_array_equal(np.asarray(uncached.tokens), batch)


@pytest.mark.parametrize("case", CAUSAL)
def test_an_array_with_lengths_equals_the_list_of_rows(case):
    cfg, params = hf.load(GOLDENS / case)
    model, data = build(cfg), expected(case)
    M = data["generated"].shape[1]
    prompts = data["prompts"].astype(np.int32)
    out = generate(model, params, prompts, Greedy(), M, eos_id=None, lengths=data["prompt_lengths"])
    np.testing.assert_array_equal(np.asarray(out.tokens), data["generated_padded"])


@pytest.mark.parametrize("case", CAUSAL)
def test_no_bos_is_put_before_an_imported_prompt(case):
    """Continuing ``BOS + prompt`` is not what the model gives for ``prompt``: the golden
    (transformers on the bare ids) differs from it, and tfmjax follows the golden."""
    cfg, params = hf.load(GOLDENS / case)
    model, data = build(cfg), expected(case)
    prompt = [int(t) for t in data["prompts"][0]]
    M = data["generated"].shape[1]
    with_bos = generate(model, params, [[cfg.bos_id, *prompt]], Greedy(), M, eos_id=None)
    plain = generate(model, params, [prompt], Greedy(), M, eos_id=None)
    np.testing.assert_array_equal(np.asarray(plain.tokens)[0], data["generated"][0])
    assert not np.array_equal(np.asarray(with_bos.tokens)[0], data["generated"][0])


@pytest.mark.parametrize("case", ["llama_hf_ids", "marian_hf_ids"])
def test_generation_stops_at_the_imported_eos(case, tmp_path):
    """``eos_token_id`` of generation_config.json (a list: its first id) stops a row."""
    data = expected(case)
    stop = int(data["generated"][0][3])
    first = int(np.flatnonzero(data["generated"][0] == stop)[0])
    shutil.copytree(GOLDENS / case, tmp_path / case)
    gen = {"eos_token_id": [stop, 7]}
    (tmp_path / case / "generation_config.json").write_text(json.dumps(gen))
    cfg, params = hf.load(tmp_path / case)
    assert cfg.eos_id == stop
    M = data["generated"].shape[1]
    out = generate(build(cfg), params, rows(case, data)[:1], Greedy(), M)
    assert int(out.lengths[0]) == first + 1
    want = np.where(np.arange(M) <= first, data["generated"][0], 0)
    np.testing.assert_array_equal(np.asarray(out.tokens)[0], want)


def test_generate_cli_continues_ids_holding_zero_exactly(tmp_path, capsys):
    from tfmjax.generate import main as generate_main
    from tfmjax.hf.cli import main

    work = tmp_path / "work"
    assert main(["import", str(GOLDENS / "gpt2_hf_ids"), str(work)]) == 0
    data = expected("gpt2_hf_ids")
    prompt = " ".join(map(str, data["prompts"][0]))
    assert prompt.startswith("0 ") and " 0 " in prompt and prompt.endswith(" 0")
    capsys.readouterr()
    assert generate_main([str(work), "--ids", prompt, "--max-new-tokens", "16"]) == 0
    got = capsys.readouterr().out.strip().split(" -> ")[1]
    assert got == " ".join(map(str, data["generated"][0]))


@live
@pytest.mark.parametrize("case", CASES)
def test_logits_and_greedy_equal_live_transformers(case):
    mg = make_goldens()
    torch_model = mg.load_torch(GOLDENS / case, mg.CASES[case][2])
    data = mg.inputs(case)
    cfg, params = hf.load(GOLDENS / case)
    model = build(cfg)
    want = mg.torch_logits(torch_model, data)
    ids = data["input_ids"].astype(np.int32)
    if "decoder_input_ids" in data:
        batch = {"inputs": ids, "targets": data["decoder_input_ids"][:, 1:].astype(np.int32)}
    else:
        batch = {"tokens": ids[:, 1:]}
    got = np.asarray(jax.jit(model.apply)(params, batch))
    np.testing.assert_allclose(got, want[:, :-1], atol=TOL, rtol=0)
    prompts, M = rows(case, data), mg.NEW_TOKENS
    lengths = [len(p) for p in prompts]
    want, _ = mg.torch_greedy(torch_model, data["prompts"], M, lengths=lengths)
    out = generate(model, params, prompts, Greedy(), M, eos_id=None)
    np.testing.assert_array_equal(np.asarray(out.tokens), want)
