"""A wrong or missing tensor, a shape mismatch or an unsupported field: one clear line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tfmjax import hf
from tfmjax.config import ModelConfig, preset

GOLDENS = Path(__file__).parent / "goldens"


def copy_case(case: str, tmp_path: Path) -> Path:
    out = tmp_path / case
    shutil.copytree(GOLDENS / case, out)
    return out


def edit_tensors(directory: Path, fn) -> None:
    tensors = load_file(directory / "model.safetensors")
    fn(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def edit_config(directory: Path, **fields) -> None:
    raw = json.loads((directory / "config.json").read_text())
    raw.update(fields)
    (directory / "config.json").write_text(json.dumps(raw))


def one_line_error(directory, match: str) -> str:
    with pytest.raises(hf.HFError, match=match) as err:
        hf.load(directory)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_tensor(tmp_path):
    d = copy_case("gpt2", tmp_path)
    edit_tensors(d, lambda t: t.pop("transformer.h.1.ln_2.bias"))
    one_line_error(d, r"has no tensor 'transformer.h.1.ln_2.bias'")


def test_shape_mismatch(tmp_path):
    d = copy_case("llama_gqa", tmp_path)
    name = "model.layers.0.self_attn.k_proj.weight"
    edit_tensors(d, lambda t: t.update({name: np.zeros((32, 32), np.float16)}))
    one_line_error(d, rf"tensor '{name}' has shape \(32, 32\) but this config needs \(16, 32\)")


def test_unexpected_tensor(tmp_path):
    d = copy_case("llama_gqa", tmp_path)
    edit_tensors(d, lambda t: t.update({"model.layers.2.mlp.up_proj.weight": t["lm_head.weight"]}))
    one_line_error(d, "holds tensor 'model.layers.2.mlp.up_proj.weight' that this config has no")


def test_untied_checkpoint_read_as_tied_is_refused(tmp_path):
    d = copy_case("llama_gqa", tmp_path)
    edit_config(d, tie_word_embeddings=True)
    one_line_error(d, "holds tensor 'lm_head.weight'")


@pytest.mark.parametrize(
    "case, fields, match",
    [
        ("llama_gqa", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        (
            "llama_gqa",
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}},
            "rope_parameters.rope_type='llama3'",
        ),
        ("llama_gqa", {"hidden_act": "relu"}, "hidden_act='relu' is not supported"),
        ("llama_gqa", {"sliding_window": 16}, "sliding_window=16 is not supported"),
        ("gpt2", {"activation_function": "gelu_fast"}, "activation_function='gelu_fast'"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("gpt2", {"attn_implementation": "flex"}, "attn_implementation='flex'"),
        ("gpt2", {"model_type": "mistral"}, "model_type='mistral' is not supported"),
        ("gpt2", {"bos_token_id": 500}, "bos_token_id=500"),
        ("gpt2", {"n_head": 5}, "invalid tfmjax config: model.d_model=32"),
        ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("bart", {"decoder_attention_heads": 2}, "decoder_attention_heads=2 is not supported"),
        ("marian", {"share_encoder_decoder_embeddings": False}, "share_encoder_decoder"),
        ("t5_v1_0", {"feed_forward_proj": "gated-relu"}, "feed_forward_proj='gated-relu'"),
    ],
)
def test_unsupported_config_field(tmp_path, case, fields, match):
    d = copy_case(case, tmp_path)
    edit_config(d, **fields)
    one_line_error(d, match)


def test_missing_files(tmp_path):
    one_line_error(tmp_path, "config.json does not exist")
    (tmp_path / "config.json").write_text("{")
    one_line_error(tmp_path, "config.json is not valid JSON")
    shutil.copy(GOLDENS / "gpt2" / "config.json", tmp_path / "config.json")
    one_line_error(tmp_path, "model.safetensors does not exist")


def test_export_refuses_what_no_architecture_computes(tmp_path):
    cfg = preset("tiny-gpt2", position="alibi")
    with pytest.raises(hf.HFError, match=r"cannot export as gpt2: model.position='alibi'"):
        hf.save(cfg, {}, tmp_path)
    cfg = preset("tiny-llama", rope_layout="interleaved")
    with pytest.raises(hf.HFError, match="model.rope_layout='interleaved'"):
        hf.save(cfg, {}, tmp_path, arch="llama")
    with pytest.raises(hf.HFError, match="architecture 'gemma' is not one of"):
        hf.save(ModelConfig(), {}, tmp_path, arch="gemma")
    with pytest.raises(hf.HFError, match=r"^model.moe_experts=4: no Hugging Face architecture"):
        hf.save(preset("tiny-mixtral"), {}, tmp_path, arch="llama")


def test_export_of_params_that_do_not_fit_the_config(tmp_path):
    cfg, params = hf.load(GOLDENS / "gpt2")
    with pytest.raises(
        hf.HFError,
        match=r"params do not fit the config: decoder/layers/mlp/down/kernel is \(2, 32, 32\), "
        r"the config needs \(2, 48, 32\)",
    ):
        hf.save(dataclasses.replace(cfg, d_ff=48), params, tmp_path)
