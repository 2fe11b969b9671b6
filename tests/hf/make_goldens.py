"""Regenerate the golden files of tests/hf: tiny random ``transformers`` models, their logits
and greedy generations, computed by torch.

Needs ``pip install -e '.[hf-dev]'`` (transformers and a CPU torch). Run from the repository
root: ``python tests/hf/make_goldens.py [CASE ...]`` (default: every case). Writes
``tests/hf/goldens/<case>/`` with ``config.json`` and ``model.safetensors`` (float16: small,
and exactly float32 after loading; a case that has them keeps them, ``--rebuild`` draws them
afresh), ``expected.npz`` (``input_ids``, ``logits``, ``prompts``, ``generated``; the
``*_hf_ids`` cases also ``prompt_lengths`` and ``generated_padded``), and
``tests/hf/goldens/versions.json`` (the transformers and torch that computed them).

Most cases use tfmjax's toy ids (0 pad, 1 bos, 2 eos). The ``*_hf_ids`` cases keep their
architecture's own special-token layout, where 0 is a real token (GPT-2's ``!``, Llama's
``<unk>``, BART's ``<s>``, Marian's ``</s>``), and their inputs hold 0 at the start, in the
middle and at the end.

The tests import this file for the live comparison when torch is installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

GOLDENS = Path(__file__).with_name("goldens")
NEW_TOKENS = 16
# Tiny models: vocabulary 96, width 32, 2 layers. Token ids: 0 pad, 1 bos, 2 eos (tfmjax's).
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# BART and Marian share the architecture: one tiny shape for both.
BART_DIMS = dict(
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
BART_SHAPE = dict(IDS, **BART_DIMS)
GPT2_DIMS = dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_inner=32)
LLAMA_DIMS = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
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
    # The architectures' own token ids; 0 is a real token in each.
    "gpt2_hf_ids": (  # bos = eos = the last id (GPT-2's <|endoftext|>), no pad id
        "GPT2Config",
        "GPT2LMHeadModel",
        "causal",
        dict(GPT2_DIMS, bos_token_id=95, eos_token_id=95, initializer_range=0.2),
    ),
    "llama_hf_ids": (  # 0 <unk>, 1 <s>, 2 </s>, no pad id
        "LlamaConfig",
        "LlamaForCausalLM",
        "causal",
        dict(LLAMA_DIMS, bos_token_id=1, eos_token_id=2, initializer_range=0.2),
    ),
    "bart_hf_ids": (  # 0 <s>, 1 <pad>, 2 </s> (also the decoder start)
        "BartConfig",
        "BartForConditionalGeneration",
        "seq2seq",
        dict(
            BART_DIMS,
            bos_token_id=0,
            pad_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_bos_token_id=None,
        ),
    ),
    "marian_hf_ids": (  # 0 </s>, the last id <pad> (also the decoder start), no BOS
        "MarianConfig",
        "MarianMTModel",
        "seq2seq",
        dict(
            BART_DIMS,
            eos_token_id=0,
            pad_token_id=95,
            decoder_start_token_id=95,
            scale_embedding=True,
            activation_function="swish",
        ),
    ),
}
AUTO = {
    "causal": "AutoModelForCausalLM",
    "masked": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
}


def inputs(name: str) -> dict:
    """The token ids a case is evaluated on (BOS first). Toy-id cases never hold 0 (their
    padding id); ``*_hf_ids`` cases: :func:`hf_ids_inputs`. Causal prompts start with BOS
    themselves: generation continues exactly the ids it is given, as transformers does."""
    if name.endswith("_hf_ids"):
        return hf_ids_inputs(name)
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
    prompts = np.zeros((2, 6), np.int64)
    prompts[:, 0] = CASES[name][3]["bos_token_id"]
    prompts[0, 1:] = rng.integers(3, 96, size=5)
    prompts[1, 1:4] = rng.integers(3, 96, size=3)
    return {"input_ids": ids, "prompts": prompts}


def hf_ids_inputs(name: str) -> dict:
    """Inputs of a ``*_hf_ids`` case in its own layout, 0 at the start, middle and end.

    Causal (no pad id): ``input_ids`` ``BOS 0 ... 0 ... 0``; ``prompts`` ``[2,6]`` whole rows
    (continued as given, no BOS) and ``prompt_lengths`` for a padded batch of their starts.
    Seq2seq: encoder ``input_ids`` and ``decoder_input_ids`` (behind the start token) with 0
    in them; ``prompts`` right-padded with the model's pad id.
    """
    kind, config = CASES[name][2], CASES[name][3]
    rng = np.random.default_rng(sum(map(ord, name)))
    draw = lambda *shape: rng.integers(3, 95, size=shape)  # never pad, BOS or EOS
    ids = draw(2, 12)
    ids[0, [0, 5, 11]] = 0
    ids[1, [3, 4, 11]] = 0
    if kind == "causal":
        ids[:, 0] = config["bos_token_id"]
        ids[0, 1] = 0
        prompts = draw(2, 6)
        prompts[0, [0, 3, 5]] = 0
        prompts[1, [1, 3]] = 0
        return {"input_ids": ids, "prompts": prompts, "prompt_lengths": np.array([6, 4])}
    pad, eos = config["pad_token_id"], config["eos_token_id"]
    ids[0, -1] = eos  # BART: <s> ... </s> ; Marian: ... </s> (= 0)
    decoder = draw(2, 8)
    decoder[:, 0] = config["decoder_start_token_id"]
    decoder[0, [1, 4, 7]] = 0
    decoder[1, [2, 7]] = 0
    prompts = np.full((2, 7), pad)
    prompts[0] = [0, *draw(2), 0, *draw(2), eos]
    prompts[1, :4] = [*draw(1), 0, *draw(1), eos]
    if eos != 0:  # BART: <s> first
        prompts[1, 0] = 0
    return {"input_ids": ids, "decoder_input_ids": decoder, "prompts": prompts}


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

    kwargs = {
        k: torch.as_tensor(v) for k, v in data.items() if k not in ("prompts", "prompt_lengths")
    }
    with torch.no_grad():
        return model(**kwargs).logits.float().numpy()


def torch_greedy(model, prompts: np.ndarray, new_tokens: int = NEW_TOKENS, lengths=None):
    """Greedy continuation ``[B,M]`` of each right-padded prompt, one row at a time (a full
    forward per step: the plain definition), and the smallest top-1 margin seen. A row is
    its first ``lengths[i]`` ids (default: those before the config's ``pad_token_id``; all
    when it has none). Causal models continue exactly those ids; encoder-decoders decode
    behind the start token."""
    import torch

    config = model.config
    if lengths is None:
        pad = config.pad_token_id
        lengths = [len(p) if pad is None else int((p != pad).sum()) for p in prompts]
    rows, margin = [], np.inf
    for prompt, n in zip(prompts, lengths, strict=True):
        ids = [int(t) for t in prompt[:n]]
        if config.is_encoder_decoder:
            source, ids = torch.as_tensor([ids]), [config.decoder_start_token_id]
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


def main(argv: list[str]) -> None:
    import torch
    import transformers

    rebuild = "--rebuild" in argv
    names = [a for a in argv if a != "--rebuild"] or list(CASES)
    GOLDENS.mkdir(exist_ok=True)
    for name in names:
        out = GOLDENS / name
        kind = CASES[name][2]
        if rebuild or not (out / "model.safetensors").is_file():
            build_torch(name).half().save_pretrained(out)
        model = load_torch(out, kind)
        (out / "generation_config.json").unlink(missing_ok=True)
        data = inputs(name)
        arrays = dict(data, logits=torch_logits(model, data))
        if "prompts" in data:
            generated, margin = torch_greedy(model, data["prompts"])
            if "prompt_lengths" in data:
                padded, more = torch_greedy(model, data["prompts"], lengths=data["prompt_lengths"])
                arrays["generated_padded"], margin = padded, min(margin, more)
            assert margin > 1e-3, f"{name}: greedy top-1 margin {margin} too small to compare"
            arrays["generated"] = generated
            print(f"{name}: greedy margin {margin:.4f}")
        np.savez(out / "expected.npz", **arrays)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    (GOLDENS / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
