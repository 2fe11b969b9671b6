"""A checkpoint whose ``pad_token_id`` is also its BOS or an EOS (the common recipe of a
fine-tuned GPT-2 or Llama: ``model.config.pad_token_id = tokenizer.eos_token_id``).

That id is a token of ordinary text: GPT-2's ``<|endoftext|>`` separates documents and is
the BOS a prompt starts with (TransformerLens, lm-evaluation-harness). transformers attends
to it, since its attention mask comes from lengths; so the import has no pad id
(``model.pad_id = None``) and gives the same logits and continuations as the checkpoint
without the field, whose numbers tests/hf/test_token_zero.py compares with transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from tfmjax import hf
from tfmjax.decode import Greedy, generate
from tfmjax.models import build

GOLDENS = Path(__file__).parent / "goldens"
GPT2 = "gpt2_hf_ids"  # BOS = EOS = 95 (its <|endoftext|>), no pad id
SEPARATOR = 95


def with_fields(tmp_path: Path, case: str, config: dict, generation: dict | None = None):
    """A copy of the golden ``case`` with ``config`` fields replaced (and a
    generation_config.json of ``generation``)."""
    directory = tmp_path / case
    shutil.copytree(GOLDENS / case, directory)
    raw = json.loads((directory / "config.json").read_text()) | config
    (directory / "config.json").write_text(json.dumps(raw))
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def documents(case: str) -> np.ndarray:
    """The golden's ids ``[B,T]`` with the separator first and twice inside each row."""
    with np.load(GOLDENS / case / "expected.npz") as data:
        ids = data["input_ids"].astype(np.int32)
    ids[:, 0], ids[:, 4], ids[:, 9] = SEPARATOR, SEPARATOR, SEPARATOR
    return ids


def test_a_pad_id_equal_to_bos_and_eos_is_a_token(tmp_path):
    plain_cfg, params = hf.load(GOLDENS / GPT2)
    cfg, same_params = hf.load(with_fields(tmp_path, GPT2, {"pad_token_id": SEPARATOR}))
    assert (plain_cfg.pad_id, cfg.pad_id, cfg.eos_id) == (None, None, SEPARATOR)
    ids = documents(GPT2)
    want = jax.jit(build(plain_cfg).apply)(params, {"tokens": ids})
    got = jax.jit(build(cfg).apply)(same_params, {"tokens": ids})
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_prompt_may_start_with_the_separator(tmp_path):
    """``<|endoftext|>`` first, then text, another document: continued, not refused as
    padding before a token."""
    plain_cfg, params = hf.load(GOLDENS / GPT2)
    cfg, _ = hf.load(with_fields(tmp_path, GPT2, {"pad_token_id": SEPARATOR}))
    prompts = [[SEPARATOR, 0, 62, 50, SEPARATOR, 7], [SEPARATOR, 13, 44]]
    want = generate(build(plain_cfg), params, prompts, Greedy(), 6, eos_id=None)
    got = generate(build(cfg), params, prompts, Greedy(), 6, eos_id=None)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))


@pytest.mark.parametrize(
    "config, generation",
    [
        ({"pad_token_id": 2}, None),  # Llama's </s>
        ({"pad_token_id": 1}, None),  # Llama's <s>
        ({"pad_token_id": 7}, {"eos_token_id": [2, 7]}),  # one of generation_config's EOS ids
    ],
    ids=["eos", "bos", "second_generation_eos"],
)
def test_llama_pad_ids_that_are_text_ids_are_dropped(tmp_path, config, generation):
    cfg, _ = hf.load(with_fields(tmp_path, "llama_hf_ids", config, generation))
    assert cfg.pad_id is None


@pytest.mark.parametrize("case", ["bart_hf_ids", "marian_hf_ids", "t5_v1_1", "llama_gqa"])
def test_a_pad_id_of_its_own_stays_the_pad_id(case):
    cfg, _ = hf.load(GOLDENS / case)
    assert cfg.pad_id == hf.read_config(GOLDENS / case)["pad_token_id"]
