"""Regenerate the golden files of tests/hf: tiny random ``transformers`` models, their logits
and greedy generations, computed by torch.

Needs ``pip install -e '.[hf-dev]'`` (transformers and a CPU torch). Run from the repository
root: ``python tests/hf/make_goldens.py``. Writes ``tests/hf/goldens/<case>/`` with
``config.json`` and ``model.safetensors`` (float16: small, and exactly float32 after
loading), ``expected.npz`` (``input_ids``, ``logits``, ``prompts``, ``generated``), and
``tests/hf/goldens/versions.json`` (the transformers and torch that computed them).

The tests import this file for the live comparison when torch is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GOLDENS = Path(__file__).with_name("goldens")
NEW_TOKENS = 16
# Tiny models: vocabulary 96, width 32, 2 layers. Token ids: 0 pad, 1 bos, 2 eos (tfmjax's).
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# BART and Marian share the architecture: one tiny shape for both.
BART_SHAPE = dict(
    IDS,
    vocab_size=96,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
    forced_eos_token_id=None,
    init_std=0.2,
)
CASES = {  # case: (config class, model class, kind, config fields)
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        "causal",
        dict(
            IDS,
            vocab_size=96,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=32,
            n_inner=32,
            initializer_range=0.2,
        ),
    ),
    "llama_gqa": (
        "LlamaConfig",
        "LlamaForCausalLM",
        "causal",
        dict(
            IDS,
            vocab_size=96,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            initializer_range=0.2,
        ),
    ),
    "llama_mqa": (
        "LlamaConfig",
        "LlamaForCausalLM",
        "causal",
        dict(
            IDS,
            vocab_size=96,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=32,
            attention_bias=True,
            tie_word_embeddings=True,
            rope_theta=500.0,
            initializer_range=0.2,
        ),
    ),
    "bert": (
        "BertConfig",
        "BertForMaskedLM",
        "masked",
        dict(
            vocab_size=96,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=32,
            max_position_embeddings=32,
            type_vocab_size=2,
            initializer_range=0.2,
        ),
    ),
    "bart": (
        "BartConfig",
        "BartForConditionalGeneration",
        "seq2seq",
        dict(BART_SHAPE, decoder_start_token_id=2),
    ),
    "marian": (
        "MarianConfig",
        "MarianMTModel",
        "seq2seq",
        dict(
            BART_SHAPE,
            decoder_start_token_id=0,
            scale_embedding=True,
            activation_function="swish",
        ),
    ),
    "t5_v1_0": (
        "T5Config",
        "T5ForConditionalGeneration",
        "seq2seq",
        dict(
            vocab_size=96,
            d_model=32,
            d_kv=8,
            d_ff=32,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            feed_forward_proj="relu",
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=2,
        ),
    ),
    "t5_v1_1": (
        "T5Config",
        "T5ForConditionalGeneration",
        "seq2seq",
        dict(
            vocab_size=96,
            d_model=32,
            d_kv=8,
            d_ff=32,
            num_layers=2,
            num_decoder_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=2,
        ),
    ),
}
AUTO = {
    "causal": "AutoModelForCausalLM",
    "masked": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
}


def inputs(name: str) -> dict:
    """The token ids a case is evaluated on (BOS first; never 0, tfmjax's padding id)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    ids = rng.integers(3, 96, size=(2, 12))
    ids[:, 0] = 1
    if CASES[name][2] == "masked":  # segment A then B; no generation
        token_types = (np.arange(12)[None, :] >= np.array([[7], [4]])).astype(np.int64)
        return {"input_ids": ids, "token_type_ids": token_types}
    if CASES[name][2] == "seq2seq":  # source EOS; decoder inputs behind the start token
        ids[:, 0], ids[:, -1] = rng.integers(3, 96, size=2), 2
        decoder = rng.integers(3, 96, size=(2, 8))
        decoder[:, 0] = CASES[name][3]["decoder_start_token_id"]
        prompts = np.zeros((2, 6), np.int64)
        prompts[0] = [*rng.integers(3, 96, size=5), 2]
        prompts[1, :4] = [*rng.integers(3, 96, size=3), 2]
        return {"input_ids": ids, "decoder_input_ids": decoder, "prompts": prompts}
    prompts = np.zeros((2, 5), np.int64)
    prompts[0] = rng.integers(3, 96, size=5)
    prompts[1, :3] = rng.integers(3, 96, size=3)
    return {"input_ids": ids, "prompts": prompts}


def build_torch(name: str):
    """A seeded random model of ``name`` with float16-exact float32 weights."""
    import torch
    import transformers

    config_cls, model_cls, _, kwargs = CASES[name]
    torch.manual_seed(sum(map(ord, name)))
    config = getattr(transformers, config_cls)(**kwargs)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model


def load_torch(directory, kind: str):
    """``from_pretrained(directory)`` in float32, eval mode (``kind``: a key of AUTO)."""
    import torch
    import transformers

    cls = getattr(transformers, AUTO[kind])
    return cls.from_pretrained(str(directory), dtype=torch.float32).eval()


def torch_logits(model, data: dict) -> np.ndarray:
    """``[B,T,V]`` float32 logits of the arrays of :func:`inputs` (``prompts`` aside)."""
    import torch

    kwargs = {k: torch.as_tensor(v) for k, v in data.items() if k != "prompts"}
    with torch.no_grad():
        return model(**kwargs).logits.float().numpy()


def torch_greedy(model, prompts: np.ndarray, new_tokens: int = NEW_TOKENS):
    """Greedy continuation ``[B,M]`` of each right-padded prompt, one row at a time (a full
    forward per step: the plain definition), and the smallest top-1 margin seen. Causal
    models continue ``BOS prompt``; encoder-decoders decode behind the start token."""
    import torch

    config = model.config
    rows, margin = [], np.inf
    for prompt in prompts:
        ids = [int(t) for t in prompt if t != 0]
        if config.is_encoder_decoder:
            source, ids = torch.as_tensor([ids]), [config.decoder_start_token_id]
        else:
            ids = [config.bos_token_id] + ids
        new = []
        for _ in range(new_tokens):
            current = torch.as_tensor([ids + new])
            with torch.no_grad():
                if config.is_encoder_decoder:
                    out = model(input_ids=source, decoder_input_ids=current)
                else:
                    out = model(current)
            logits = out.logits[0, -1].float().numpy()
            top2 = np.sort(logits)[-2:]
            margin = min(margin, float(top2[1] - top2[0]))
            new.append(int(np.argmax(logits)))
        rows.append(new)
    return np.asarray(rows, np.int64), margin


def main() -> None:
    import torch
    import transformers

    GOLDENS.mkdir(exist_ok=True)
    for name in CASES:
        model = build_torch(name)
        out = GOLDENS / name
        model.half().save_pretrained(out)
        kind = CASES[name][2]
        model = load_torch(out, kind)
        (out / "generation_config.json").unlink(missing_ok=True)
        data = inputs(name)
        arrays = dict(data, logits=torch_logits(model, data))
        if "prompts" in data:
            generated, margin = torch_greedy(model, data["prompts"])
            assert margin > 1e-3, f"{name}: greedy top-1 margin {margin} too small to compare"
            arrays["generated"] = generated
            print(f"{name}: greedy margin {margin:.4f}")
        np.savez(out / "expected.npz", **arrays)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    (GOLDENS / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")


if __name__ == "__main__":
    main()
