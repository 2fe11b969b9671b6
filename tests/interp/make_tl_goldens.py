"""Regenerate the TransformerLens goldens of tests/interp: a tiny GPT-2 run by TransformerLens
4.3's ``TransformerBridge``; its logits, activations, cache helpers and a resid_pre patching sweep.

Needs ``pip install torch==2.13.0 transformer-lens==4.3.0`` (which brings ``transformers``), no
network. Run from the repository root: ``python tests/interp/make_tl_goldens.py``.

The model is tests/hf/goldens/gpt2_hf_ids (vocabulary 96, width 32, 2 layers, 4 heads, BOS = EOS =
95) with seeded LayerNorm weights and biases, seeded linear biases (that model has unit LayerNorm
weights and zero biases: folding, LayerNorm affine terms and output biases would leave no trace)
and a seeded MLP of width 64 (see ``D_MLP``). It is written to tests/interp/goldens/tl_gpt2/
(``config.json``, float16 ``model.safetensors``) with:

- ``expected.npz``: the inputs ``tokens``, ``corrupted``, ``answer``, ``wrong``; float32
  ``raw/*`` (``enable_compatibility_mode(no_processing=True)``, HF's own weights): ``logits``,
  ``W_U``, ``b_U``, every cached activation as ``raw/cache/<TL's canonical hook name>``,
  ``raw/helper/<name>`` (ActivationCache helpers), ``raw/getitem/<name>`` (tuple keys),
  ``patch_resid_pre`` [layer, pos], ``metric_clean`` and ``metric_corrupted``; ``folded/*``
  (``fold_ln=True``, nothing centered, value biases not folded): ``logits``, ``W_U``, ``b_U``,
  the ``ln_final`` cache entries and the same helpers.
- ``names.json``: the hook names cached, the aliases of each canonical name, the helpers'
  labels and the names the tuple keys resolved to.
- ``versions.json``: the transformer_lens, transformers and torch that computed them.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformer_lens import TransformerBridge, patching  # noqa: E402
from transformer_lens.model_bridge.bridge_core import build_alias_to_canonical_map  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402

HERE = Path(__file__).parent
BASE = HERE.parent / "hf" / "goldens" / "gpt2_hf_ids"
OUT = HERE / "goldens" / "tl_gpt2"
BOS = 95
SEED = 0
CORRUPT = {0: (2, 4), 1: (1, 6)}  # row: the positions changed in `corrupted`
# MLP width: not the model width (32). TL 4.3 folds ln2 into a square W_in along the wrong axis,
# and a square W_in would hide a transposed layout anywhere else too.
D_MLP = 64


def write_model() -> None:
    """The base model with a wider MLP and seeded LayerNorm affine terms and biases, saved in
    float16 (the only rounding: float16 is exact in float32)."""
    rng = np.random.default_rng(SEED)
    weights = load_file(BASE / "model.safetensors")
    config = json.loads((BASE / "config.json").read_text())
    d_model = config["n_embd"]
    config["n_inner"] = D_MLP
    for layer in range(config["n_layer"]):
        mlp = f"transformer.h.{layer}.mlp"
        weights[f"{mlp}.c_fc.weight"] = torch.zeros(d_model, D_MLP)  # Conv1D: [in, out]
        weights[f"{mlp}.c_fc.bias"] = torch.zeros(D_MLP)
        weights[f"{mlp}.c_proj.weight"] = torch.zeros(D_MLP, d_model)
    for name, w in sorted(weights.items()):
        if name.endswith("mlp.c_fc.weight") or name.endswith("mlp.c_proj.weight"):
            std = 0.2 if "c_fc" in name else 0.1  # GPT-2's init: 0.2, c_proj 0.2 / sqrt(2 n_layer)
            weights[name] = torch.from_numpy(rng.normal(0.0, std, w.shape))
        elif name.endswith(".bias") or (".ln_" in name and name.endswith(".weight")):
            mean = 1.0 if name.endswith(".weight") else 0.0
            weights[name] = torch.from_numpy(rng.normal(mean, 0.2 if mean else 0.1, w.shape))
        weights[name] = weights[name].to(torch.float16).contiguous()
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(weights, OUT / "model.safetensors", metadata={"format": "pt"})
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_hf() -> GPT2LMHeadModel:
    kwargs = dict(torch_dtype=torch.float32, attn_implementation="eager")
    return GPT2LMHeadModel.from_pretrained(OUT, **kwargs).eval()


def boot(**compat) -> TransformerBridge:
    """A bridge over a fresh copy of the model (weight processing edits it in place)."""
    bridge = TransformerBridge.boot_transformers(str(OUT), hf_model=load_hf(), device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True, **compat)
    bridge.set_use_attn_result(True)
    bridge.set_use_hook_mlp_in(True)
    return bridge.eval()


def make_tokens() -> tuple[np.ndarray, np.ndarray]:
    """Clean rows: BOS first, the real token 0 in the middle, a second 95 in row 0."""
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(1, BOS, size=(2, 8), dtype=np.int64)
    tokens[:, 0] = BOS
    tokens[0, 3] = tokens[1, 4] = 0
    tokens[0, 5] = BOS
    corrupted = tokens.copy()
    for row, positions in CORRUPT.items():
        for t in positions:
            corrupted[row, t] = 1 + (tokens[row, t] + 40) % (BOS - 1)
    return tokens, corrupted


def pick_answers(clean: torch.Tensor, corrupt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Answer: the clean run's top token at the last position; wrong: the corrupted run's top
    token there (the clean runner-up where both agree)."""
    top = clean[:, -1].topk(2).indices.numpy()
    bad = corrupt[:, -1].argmax(-1).numpy()
    wrong = np.where(bad == top[:, 0], top[:, 1], bad)
    return top[:, 0].astype(np.int64), wrong.astype(np.int64)


def logit_diff(answer: np.ndarray, wrong: np.ndarray):
    rows = torch.arange(len(answer))
    a, w = torch.from_numpy(answer), torch.from_numpy(wrong)
    return lambda logits: (logits[rows, -1, a] - logits[rows, -1, w]).mean()


def np32(x: torch.Tensor) -> np.ndarray:
    """Float tensors as float32; the integer ones (token and position ids) as they are."""
    return (x.float() if x.is_floating_point() else x).detach().cpu().numpy()


def aliases_of(bridge: TransformerBridge) -> dict[str, list[str]]:
    """{canonical hook name: [aliases]}, canonical being the HookPoint's own ``.name``."""
    out: dict[str, list[str]] = {}
    for alias, canonical in build_alias_to_canonical_map(bridge.hook_dict).items():
        out.setdefault(canonical, []).append(alias)
    return {k: sorted(v) for k, v in sorted(out.items())}


def canonical_cache(bridge, cache) -> dict[str, torch.Tensor]:
    """Each cached hook point once, under its canonical name (aliases are the same tensor)."""
    to_canonical = build_alias_to_canonical_map(bridge.hook_dict)
    out = {}
    for name, value in cache.items():
        canonical = to_canonical.get(name, name)
        if canonical in out:
            assert torch.equal(out[canonical], value), name
        out[canonical] = value
    return out


def store_helpers(prefix, cache, answer, wrong, arrays, labels) -> None:
    """The ActivationCache helpers, as ``<prefix>/helper/<name>`` and their labels."""
    a, w = torch.from_numpy(answer), torch.from_numpy(wrong)
    decomposed, decomposed_labels = cache.decompose_resid(
        pos_slice=-1, apply_ln=False, return_labels=True
    )
    heads, head_labels = cache.stack_head_results(
        layer=-1, return_labels=True, incl_remainder=True, pos_slice=-1, apply_ln=False
    )
    at_block1, block1_labels = cache.decompose_resid(layer=1, return_labels=True)
    results = {
        "accumulated_resid": cache.accumulated_resid(
            layer=None, incl_mid=True, apply_ln=True, pos_slice=-1, return_labels=True
        ),
        "accumulated_resid_l1_mlp_input": cache.accumulated_resid(
            layer=1, incl_mid=False, apply_ln=True, mlp_input=True, return_labels=True
        ),
        "decompose_resid": cache.decompose_resid(apply_ln=True, pos_slice=-1, return_labels=True),
        "decompose_resid_l1_mlp_input_attn": cache.decompose_resid(
            layer=1, mlp_input=True, mode="attn", apply_ln=False, return_labels=True
        ),
        "stack_head_results": cache.stack_head_results(
            layer=-1, return_labels=True, incl_remainder=True, pos_slice=-1, apply_ln=True
        ),
        "apply_ln_to_stack_l1": (cache.apply_ln_to_stack(at_block1, layer=1), block1_labels),
        "logit_attrs_decomposed": (
            cache.logit_attrs(decomposed, tokens=a, incorrect_tokens=w, pos_slice=-1),
            decomposed_labels,
        ),
        "logit_attrs_heads": (
            cache.logit_attrs(heads, tokens=a, incorrect_tokens=w, pos_slice=-1),
            head_labels,
        ),
    }
    for name, (value, names) in results.items():
        arrays[f"{prefix}/helper/{name}"] = np32(value)
        labels[f"{prefix}/helper/{name}"] = list(names)


def raw_mode(tokens, corrupted, answer, wrong, arrays, names) -> None:
    """Mode "raw": logits, the whole cache, the helpers, two tuple keys, the patching sweep."""
    bridge = boot(no_processing=True)
    bridge.set_use_split_qkv_input(True)
    logits, cache = bridge.run_with_cache(tokens)
    entries = canonical_cache(bridge, cache)
    # TL forbids hook_attn_in together with the split q/k/v inputs: a second run for it.
    bridge.set_use_split_qkv_input(False)
    bridge.set_use_attn_in(True)
    logits_attn_in, cache_attn_in = bridge.run_with_cache(tokens)
    assert torch.equal(logits, logits_attn_in)
    attn_in = {k: v for k, v in canonical_cache(bridge, cache_attn_in).items() if "attn_in" in k}
    entries.update(attn_in)
    names["raw_cache"], names["attn_in_run"] = list(entries), sorted(attn_in)
    names["aliases"] = {k: v for k, v in aliases_of(bridge).items() if k in entries}
    bridge.set_use_attn_in(False)
    bridge.set_use_split_qkv_input(True)
    arrays["raw/logits"] = np32(logits)
    arrays["raw/W_U"], arrays["raw/b_U"] = np32(bridge.W_U), np32(bridge.b_U)
    arrays.update({f"raw/cache/{name}": np32(value) for name, value in entries.items()})
    store_helpers("raw", cache, answer, wrong, arrays, names["labels"])
    for label, key in {"pattern_0": ("pattern", 0), "scale": "scale"}.items():
        value = cache[key]
        arrays[f"raw/getitem/{label}"] = np32(value)
        resolved = [n for n, v in cache.items() if v is value]
        names["getitem"][label] = {"key": repr(key), "resolves_to": resolved}
    patch(bridge, tokens, corrupted, cache, answer, wrong, arrays)


def patch(bridge, tokens, corrupted, cache, answer, wrong, arrays) -> None:
    """resid_pre patching over (layer, position): TL's own sweep, checked against hooks."""
    metric = logit_diff(answer, wrong)
    with torch.no_grad():
        arrays["raw/metric_clean"] = np32(metric(bridge(tokens)))
        arrays["raw/metric_corrupted"] = np32(metric(bridge(corrupted)))
        sweep = patching.get_act_patch_resid_pre(bridge, corrupted, cache, metric)
    by_hand = torch.zeros(bridge.cfg.n_layers, tokens.shape[1])
    for layer in range(bridge.cfg.n_layers):
        name = f"blocks.{layer}.hook_resid_pre"
        for t in range(tokens.shape[1]):

            def put(act, hook, t=t, clean=cache[name]):
                act[:, t] = clean[:, t]
                return act

            with torch.no_grad():
                by_hand[layer, t] = metric(
                    bridge.run_with_hooks(corrupted, fwd_hooks=[(name, put)])
                )
    assert torch.allclose(sweep, by_hand, atol=1e-6), (sweep, by_hand)
    arrays["raw/patch_resid_pre"] = np32(sweep)


def folded_mode(tokens, answer, wrong, arrays, names) -> None:
    bridge = boot(
        fold_ln=True, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    logits, cache = bridge.run_with_cache(tokens)
    arrays["folded/logits"] = np32(logits)
    arrays["folded/W_U"], arrays["folded/b_U"] = np32(bridge.W_U), np32(bridge.b_U)
    for name in ("ln_final.hook_scale", "ln_final.hook_normalized"):
        arrays[f"folded/cache/{name}"] = np32(cache[name])
    store_helpers("folded", cache, answer, wrong, arrays, names["labels"])


def main() -> None:
    write_model()
    tokens, corrupted = make_tokens()
    hf = load_hf()
    with torch.no_grad():
        clean_hf = hf(torch.from_numpy(tokens)).logits
        answer, wrong = pick_answers(clean_hf, hf(torch.from_numpy(corrupted)).logits)
    arrays = dict(tokens=tokens, corrupted=corrupted, answer=answer, wrong=wrong)
    names: dict = {"labels": {}, "getitem": {}}
    t, c = torch.from_numpy(tokens), torch.from_numpy(corrupted)
    raw_mode(t, c, answer, wrong, arrays, names)
    folded_mode(t, answer, wrong, arrays, names)
    for what, x, y in [
        ("HF eager logits - raw/logits", clean_hf.numpy(), arrays["raw/logits"]),
        ("raw/logits - folded/logits", arrays["raw/logits"], arrays["folded/logits"]),
    ]:
        print(f"max |{what}|: {np.abs(x - y).max():.3g}")
    np.savez_compressed(OUT / "expected.npz", **arrays)
    (OUT / "names.json").write_text(json.dumps(names, indent=1) + "\n")
    versions = {p: version(p) for p in ("transformer-lens", "transformers", "torch")}
    (OUT / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(f"wrote {len(arrays)} arrays to {OUT / 'expected.npz'}")


if __name__ == "__main__":
    main()
