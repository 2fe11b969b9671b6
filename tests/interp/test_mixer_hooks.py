"""Hook points of the token mixers without a softmax pattern: retention, the selective scan and
Nyström attention (``model.attention`` = "retention", "selective_scan", "nystrom").

What must hold: every hook point is listed with its documented shape; the recorded values are
the model's own computation (recomputed in float64 NumPy from other recorded values and the
params); cached logits are the plain ``apply``'s; patching with the clean values gives the
clean logits exactly, and an edit of the scores, states or kernels reaches the output; the
hooks cost nothing when off; QK/OV circuits and head scores take or refuse each mixer as
designed (:mod:`tfmjax.interp.circuits`, :mod:`tfmjax.interp.heads`).

Tolerances: the model computes in float32, the references in float64, each from recorded
inputs a few operations back: 1e-5 of the reference's largest entry (``_close``), 1e-4 where
a recurrence or a softmax of a sum of 16 products lies in between.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.interp import head_scores, hook_shapes, replace, run_with_cache, run_with_patches
from tfmjax.interp.circuits import (
    attention_weights,
    composition_scores,
    full_ov_circuit,
    full_qk_circuit,
    ov_circuit,
    qk_circuit,
)
from tfmjax.interp.hooked import axes
from tfmjax.models import build, preset

B, T = 2, 8
BASE = {"vocab_size": 16, "max_len": 24, "norm_position": "pre", "num_layers": 2}
# mixer -> (preset, overrides, the stack that uses it); tiny twins as tests/interp/conftest.py
MIXERS = {
    "retention": ("tiny-gpt2", dict(attention="retention", position="rope"), "decoder"),
    "selective_scan": ("tiny-gpt2", dict(attention="selective_scan"), "decoder"),
    # 4 landmarks over 8 tokens: segments of 2, so the kernels approximate, not copy.
    "nystrom": ("tiny-nystrom", dict(attention="nystrom", num_landmarks=4), "encoder"),
}


@functools.cache
def _built(random_params, name: str, family: str | None = None):
    """A tiny unrolled model of mixer ``name`` and its random params; ``family=
    "encoder_decoder"``: tiny-vaswani's, with the mixer in the stack that can take it."""
    preset_name, overrides, _ = MIXERS[name]
    preset_name = "tiny-vaswani" if family == "encoder_decoder" else preset_name
    model = build(preset(preset_name, **BASE, **overrides, scan_layers=False))
    return model, random_params(model, 0)


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    model: object
    params: dict
    batch: dict
    stack: str
    logits: jax.Array  # of the plain apply
    cache: object  # run_with_cache's, every hook point

    def get(self, layer: int, leaf: str) -> np.ndarray:
        """``{stack}.blocks.{layer}.{leaf}`` of the cache, float64."""
        return np.asarray(self.cache[f"{self.stack}.blocks.{layer}.{leaf}"], np.float64)

    def layer_params(self, layer: int) -> dict:
        tree = self.params["params"][self.stack][f"layer_{layer}"]
        return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


@pytest.fixture(scope="module", params=list(MIXERS))
def mixer(request, random_params, rows) -> Run:
    """Each mixer's tiny model run once: its plain logits and its cache of every hook."""
    model, params = _built(random_params, request.param)
    batch = rows(model, batch=B, length=T)
    _, cache = run_with_cache(model, params, batch)
    logits = jax.jit(model.apply)(params, batch)
    return Run(request.param, model, params, batch, MIXERS[request.param][2], logits, cache)


def _expected_shapes(name, cfg) -> dict:
    """Each mixer's hook points (leaf names) and their documented shapes."""
    N, H, D = cfg.num_heads, cfg.head_width, cfg.d_model
    if name == "retention":
        heads = (B, T, N, H)
        return {
            **{f"hook_{n}": heads for n in ("q", "k", "v", "rot_q", "rot_k", "z", "gate")},
            "hook_decayed_scores": (B, N, T, T),
            "hook_state": (B, N, H, H),
            "hook_result": (B, T, N, D),
        }
    if name == "selective_scan":
        E, P = cfg.ssm_expand * D, cfg.ssm_state
        channels = ("conv_in", "ssm_input", "delta", "ssm_output", "ssm_gate")
        return {
            **{f"hook_{n}": (B, T, E) for n in channels},
            "hook_B": (B, T, P),
            "hook_C": (B, T, P),
            "hook_h": (B, T, E, P),
            "hook_ssm_state": (B, E, P),
        }
    M = cfg.num_landmarks
    return {
        **{f"hook_{n}": (B, T, N, H) for n in ("q", "k", "v", "z")},
        "hook_landmarks_q": (B, M, N, H),
        "hook_landmarks_k": (B, M, N, H),
        "hook_kernel_f": (B, N, T, M),
        "hook_kernel_a": (B, N, M, M),
        "hook_kernel_b": (B, N, M, T),
        "hook_result": (B, T, N, D),
    }


def _close(actual, desired, rtol=1e-5):
    """``actual == desired`` within ``rtol`` of the largest entry of ``desired``."""
    desired = np.asarray(desired, np.float64)
    scale = max(float(np.abs(desired).max()), 1e-30)
    np.testing.assert_allclose(np.asarray(actual, np.float64), desired, rtol=0, atol=rtol * scale)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _dense(x, p):
    """``x [B,T,D] @ kernel [D,...] + bias``."""
    y = np.tensordot(x, p["kernel"], axes=1)
    return y + p["bias"] if "bias" in p else y


def _mixer_input(run: Run, l: int):
    """The mixer's input ``LN1(resid_pre) [B,T,D]`` of layer ``l``, from the cached residual
    (the models are pre-norm, LayerNorm)."""
    r = run.get(l, "hook_resid_pre")
    norm = run.layer_params(l)["attention_norm"]
    centred = r - r.mean(-1, keepdims=True)
    normed = centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + run.model.config.norm_eps)
    return normed * norm["scale"] + norm["bias"]


# -- names and shapes, and the model's own computation -------------------------------------


def test_every_hook_point_is_listed_with_its_shape(mixer):
    shapes = hook_shapes(mixer.model, mixer.params, mixer.batch)
    want = _expected_shapes(mixer.name, mixer.model.config)
    for l in range(2):
        prefix = f"{mixer.stack}.blocks.{l}.attn."
        got = {n[len(prefix) :]: s for n, s in shapes.items() if n.startswith(prefix)}
        assert got == want
        assert {n: tuple(mixer.cache[prefix + n].shape) for n in want} == want
    # Patching reads the position and head axes by name: they are the shape's T and N axes
    # (Nyström's landmark rows aside), or absent (the states).
    cfg, T = mixer.model.config, mixer.batch[mixer.model.token_keys[-1]].shape[1]
    landmark_rows = ("hook_landmarks_q", "hook_landmarks_k", "hook_kernel_a", "hook_kernel_b")
    for name, shape in want.items():
        position, head = axes(name)
        assert head is None or shape[head] == cfg.num_heads, name
        assert position is None or name in landmark_rows or shape[position] == T, name
        assert (position is None) == name.endswith("state"), name


def test_cached_logits_are_the_plain_apply(mixer):
    logits, _ = run_with_cache(mixer.model, mixer.params, mixer.batch)
    np.testing.assert_allclose(logits, mixer.logits, rtol=1e-5, atol=1e-5)


def _checked_projections(run: Run, l: int):
    """Checks layer ``l``'s ``hook_q/k/v`` against its input's projections; returns the
    reader of its ``attn.`` hooks, its attention params and its input."""
    a, p = (lambda n: run.get(l, f"attn.{n}")), run.layer_params(l)["attention"]
    x = _mixer_input(run, l)
    for n, kernel in (("q", "query"), ("k", "key"), ("v", "value")):
        _close(a(f"hook_{n}"), _dense(x, p[kernel]))
    return a, p, x


def _check_retention(run: Run, l: int):
    N, H = run.model.config.num_heads, run.model.config.head_width
    a, p, x = _checked_projections(run, l)
    gamma = 1.0 - 2.0 ** (-5.0 - np.arange(N))
    t = np.arange(T)
    decay = np.where(t[:, None] >= t, gamma[:, None, None] ** (t[:, None] - t[None]), 0.0)
    q, k, v = a("hook_rot_q"), a("hook_rot_k") / np.sqrt(H), a("hook_v")
    scores = np.einsum("BTNH,BSNH->BNTS", q, k) * decay[None]
    _close(a("hook_decayed_scores"), scores)
    _close(a("hook_z"), np.einsum("BNTS,BSNH->BTNH", scores, v))
    # The state after the sequence: sum_s gamma^(T-1-s) k_s^T v_s.
    weight = gamma[None, :] ** (T - 1 - t[:, None])  # [T,N]
    _close(a("hook_state"), np.einsum("TN,BTNH,BTNJ->BNHJ", weight, k, v))
    _close(a("hook_gate"), _silu(_dense(x, p["gate"])))
    z = a("hook_z")
    normed = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
    mixed = a("hook_gate") * (normed * p["norm_scale"] + p["norm_bias"])
    result = np.einsum("BTNH,NHD->BTND", mixed, p["out"]["kernel"])
    _close(a("hook_result"), result)
    _close(run.get(l, "hook_attn_out"), result.sum(2) + p["out"]["bias"], rtol=1e-4)


def _causal_conv(x, kernel, bias):
    """``out_t = bias + sum_i kernel[i] x_{t-W+1+i}`` (zeros before the start)."""
    W = kernel.shape[0]
    padded = np.concatenate([np.zeros((x.shape[0], W - 1, x.shape[2])), x], axis=1)
    return bias + sum(padded[:, i : i + x.shape[1]] * kernel[i] for i in range(W))


def _check_selective_scan(run: Run, l: int):
    cfg = run.model.config
    R, P = -(-cfg.d_model // 16), cfg.ssm_state
    a, p = (lambda n: run.get(l, f"attn.{n}")), run.layer_params(l)["attention"]
    xz = np.tensordot(_mixer_input(run, l), p["in_proj"]["kernel"], axes=1)  # [B,T,2,E]
    _close(a("hook_conv_in"), xz[:, :, 0])
    _close(a("hook_ssm_gate"), _silu(xz[:, :, 1]))
    u = _silu(_causal_conv(a("hook_conv_in"), p["conv_kernel"], p["conv_bias"]))
    _close(a("hook_ssm_input"), u)
    u = a("hook_ssm_input")
    dt, bm, cm = np.split(u @ p["x_proj"]["kernel"], [R, R + P], -1)
    _close(a("hook_B"), bm)
    _close(a("hook_C"), cm)
    _close(a("hook_delta"), np.logaddexp(0.0, _dense(dt, p["dt_proj"])))
    # The recurrence, a step at a time, from the recorded delta, B, C and u.
    delta, bm, cm = a("hook_delta"), a("hook_B"), a("hook_C")
    A = -np.exp(p["A_log"])  # [E,P]
    h, states = np.zeros((B, *A.shape)), []
    for s in range(T):
        h = (
            np.exp(delta[:, s, :, None] * A) * h
            + (delta[:, s] * u[:, s])[..., None] * bm[:, s, None]
        )
        states.append(h)
    states = np.stack(states, 1)  # [B,T,E,P]
    _close(a("hook_h"), states, rtol=1e-4)
    _close(a("hook_ssm_state"), states[:, -1], rtol=1e-4)
    y = np.einsum("BTEP,BTP->BTE", states, cm) + p["D_skip"] * u
    _close(a("hook_ssm_output"), y, rtol=1e-4)
    out = (a("hook_ssm_output") * a("hook_ssm_gate")) @ p["out_proj"]["kernel"]
    _close(run.get(l, "hook_attn_out"), out)


def _razavi_pinv(a, iterations=6):
    """Nyströmformer's iterative pseudo-inverse of ``a [..., M, M]``, in float64."""
    eye = np.eye(a.shape[-1])
    rows = np.abs(a).sum(-1).max(-1)[..., None, None]
    cols = np.abs(a).sum(-2).max(-1)[..., None, None]
    z = np.swapaxes(a, -1, -2) / (rows * cols)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _check_nystrom(run: Run, l: int):
    H, M = run.model.config.head_width, run.model.config.num_landmarks
    a, p, x = _checked_projections(run, l)
    q, k, v = a("hook_q"), a("hook_k"), a("hook_v")
    means = lambda y: y.reshape(B, M, T // M, *y.shape[2:]).mean(2)  # noqa: E731
    _close(a("hook_landmarks_q"), means(q))
    _close(a("hook_landmarks_k"), means(k))
    q_land, k_land = a("hook_landmarks_q"), a("hook_landmarks_k")
    logits = lambda x, y: np.einsum("BTNH,BSNH->BNTS", x, y) / np.sqrt(H)  # noqa: E731
    _close(a("hook_kernel_f"), _softmax(logits(q, k_land)), rtol=1e-4)
    _close(a("hook_kernel_a"), _softmax(logits(q_land, k_land)), rtol=1e-4)
    _close(a("hook_kernel_b"), _softmax(logits(q_land, k)), rtol=1e-4)
    # A⁺ is the paper's 6 iterations, which this float64 copy repeats. (They are far from
    # numpy.linalg.pinv on these random params' Ã, condition numbers up to ~300; a
    # well-conditioned, edited Ã: test_an_edit_reaches_the_output.)
    a_plus = _razavi_pinv(a("hook_kernel_a"))
    z = np.einsum("BNTM,BNMU,BNUS,BSNH->BTNH", a("hook_kernel_f"), a_plus, a("hook_kernel_b"), v)
    _close(a("hook_z"), z, rtol=1e-4)
    result = np.einsum("BTNH,NHD->BTND", a("hook_z"), p["out"]["kernel"])
    _close(a("hook_result"), result)
    _close(run.get(l, "hook_attn_out"), result.sum(2) + p["out"]["bias"])


def test_recorded_values_are_the_models_computation(mixer):
    """Each hook recomputed in NumPy from the params and the hooks recorded before it."""
    check = {"retention": _check_retention, "selective_scan": _check_selective_scan}
    for l in range(2):
        check.get(mixer.name, _check_nystrom)(mixer, l)


# -- patching ------------------------------------------------------------------------------


def test_patching_with_the_clean_values_gives_the_clean_logits_exactly(mixer):
    """Every mixer hook of both layers replaced by its clean value at once. Op by op, so that
    the cache and the patched run round alike (as test_hooks); ``hook_result`` reroutes the
    output through the heads' sum, so it is equal within float error only."""
    model, params, batch = mixer.model, mixer.params, mixer.batch
    names = [n for n in mixer.cache.names() if f"{mixer.stack}.blocks." in n and ".attn." in n]
    rerouting = [n for n in names if n.endswith("hook_result")]
    with jax.disable_jit():
        clean_logits, clean = run_with_cache(model, params, batch, names=names)
        edits = {n: replace(clean[n]) for n in names if n not in rerouting}
        patched, _ = run_with_patches(model, params, batch, edits)
    np.testing.assert_array_equal(patched, clean_logits)
    if rerouting:
        edits = {n: replace(mixer.cache[n]) for n in rerouting}
        patched, _ = run_with_patches(model, params, batch, edits)
        np.testing.assert_allclose(patched, mixer.logits, rtol=1e-5, atol=1e-5)


def _well_conditioned(M: int):
    """``I/2 + 1/(2M)`` ``[M,M]``: row-stochastic as Ã is, condition number 2."""
    return 0.5 * np.eye(M) + 0.5 / M


def _edit(run: Run):
    """``(hook leaf, edit, the leaf it moves, its value under the edit)``, the last in NumPy
    from the values ``a(leaf)`` recorded in the edited run."""
    if run.name == "retention":  # the scores cut to their diagonal: z_t = (q_t . k_t) v_t
        H = run.model.config.head_width

        def reference(a):
            own = np.sum(a("hook_rot_q") * a("hook_rot_k") / np.sqrt(H), -1, keepdims=True)
            return own * a("hook_v")

        diagonal = lambda x: x * jnp.eye(T, dtype=x.dtype)[None, None]  # noqa: E731
        return "hook_decayed_scores", diagonal, "hook_z", reference
    if run.name == "selective_scan":  # no state at all: y = D_skip * u
        d_skip = run.layer_params(0)["attention"]["D_skip"]
        return "hook_h", jnp.zeros_like, "hook_ssm_output", lambda a: d_skip * a("hook_ssm_input")
    M = run.model.config.num_landmarks
    edit = lambda x: jnp.broadcast_to(jnp.asarray(_well_conditioned(M), x.dtype), x.shape)  # noqa: E731
    a_plus = np.linalg.pinv(_well_conditioned(M))
    reference = lambda a: np.einsum(  # noqa: E731
        "BNTM,MU,BNUS,BSNH->BTNH", a("hook_kernel_f"), a_plus, a("hook_kernel_b"), a("hook_v")
    )
    return "hook_kernel_a", edit, "hook_z", reference


READS = {
    "retention": ("hook_rot_q", "hook_rot_k", "hook_v"),
    "selective_scan": ("hook_ssm_input",),
    "nystrom": ("hook_kernel_f", "hook_kernel_b", "hook_v"),
}


def test_an_edit_reaches_the_output(mixer):
    """Retention's scores cut to their diagonal, the scan's states zeroed, Nyström's Ã made
    well-conditioned (so that its 6-iteration A⁺ is numpy.linalg.pinv's): layer 0's output is
    what the edited value makes of the recorded inputs, and the logits move."""
    leaf, edit, out, reference = _edit(mixer)
    block = f"{mixer.stack}.blocks.0.attn."
    names = [block + n for n in (*READS[mixer.name], out)]
    logits, cache = run_with_patches(
        mixer.model, mixer.params, mixer.batch, {block + leaf: edit}, names=names
    )
    _close(cache[block + out], reference(lambda n: np.asarray(cache[block + n], np.float64)))
    assert float(jnp.max(jnp.abs(logits - mixer.logits))) > 1e-3


HOOKED_MODULES = (
    "tfmjax.layers.hooks",
    "tfmjax.layers.attention",
    "tfmjax.layers.retention",
    "tfmjax.layers.selective_scan",
    "tfmjax.layers.nystrom_attention",
    "tfmjax.layers.blocks",
    "tfmjax.layers.mlp",
    "tfmjax.layers.moe",
    "tfmjax.layers.norms",
    "tfmjax.models.common",
    "tfmjax.models.encoder_decoder",
)


def test_hooks_cost_nothing_when_off(mixer, monkeypatch, hooks_off):
    """The plain apply lowers to the same program as a model whose hooks are identities and
    whose costly activations are never wanted (as test_hooks, for each mixer)."""
    lowered = lambda: jax.jit(mixer.model.apply).lower(mixer.params, mixer.batch).as_text()  # noqa: E731
    with_hooks = lowered()
    if mixer.name == "nystrom":
        # The comparison sees a kernel hook formed while off: wanting one alters the program.
        # (An unused hook value, e.g. retention's state, is dropped before lowering anyway.)
        wanted = lambda m, n: n == "hook_kernel_f"  # noqa: E731
        monkeypatch.setattr("tfmjax.layers.nystrom_attention.wanted", wanted)
        assert lowered() != with_hooks
    hooks_off(*HOOKED_MODULES)
    assert lowered() == with_hooks


# -- circuits and head scores --------------------------------------------------------------


def _one_line_error(call, match: str):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def test_nystrom_takes_qk_and_ov_circuits(random_params):
    """Per-head query, key, value and out kernels: the circuits read them as for softmax, in
    an encoder_only model and in an encoder_decoder model's encoder."""
    for family in (None, "encoder_decoder"):
        model, params = _built(random_params, "nystrom", family)
        p = params["params"]["encoder"]["layer_1"]["attention"]
        w = attention_weights(model, params, "encoder", 1)
        qk = np.einsum("DNH,ENH->NDE", p["query"]["kernel"], p["key"]["kernel"])
        ov = np.einsum("DNH,NHE->NDE", p["value"]["kernel"], p["out"]["kernel"])
        _close(qk_circuit(w).full(), qk)
        _close(ov_circuit(w).full(), ov)
        scores = composition_scores(model, params, "encoder")
        assert np.all(np.isfinite(np.asarray(scores["v"][0, :, 1])))
        V = model.config.vocab_size
        assert full_ov_circuit(model, params, 0, "encoder").shape == (4, V, V)


def test_retention_takes_its_qk_circuit_and_refuses_ov(random_params):
    """Its score is q . k times a decay; its values pass a GroupNorm and a gate on the way to
    W_O: QK only. In an encoder_decoder model the encoder and cross-attention are softmax."""
    model, params = _built(random_params, "retention")
    p = params["params"]["decoder"]["layer_0"]["attention"]
    w = attention_weights(model, params)
    assert sorted(w) == ["W_K", "W_Q"]
    _close(
        qk_circuit(w).full(), np.einsum("DNH,ENH->NDE", p["query"]["kernel"], p["key"]["kernel"])
    )
    V = model.config.vocab_size
    assert full_qk_circuit(model, params, 1).shape == (4, V, V)
    for call in (
        lambda: full_ov_circuit(model, params, 0),
        lambda: composition_scores(model, params),
    ):
        _one_line_error(
            call,
            "OV circuits need model.attention='softmax' or 'nystrom' or 'linformer', not "
            "'retention': .*GroupNorm",
        )
    _one_line_error(lambda: ov_circuit(w), "no W_V/W_O")
    model, params = _built(random_params, "retention", "encoder_decoder")
    assert sorted(attention_weights(model, params, "encoder", 0)) == ["W_K", "W_O", "W_Q", "W_V"]
    assert full_ov_circuit(model, params, 0, "decoder", kind="cross_attn").shape == (4, V, V)
    _one_line_error(lambda: full_ov_circuit(model, params, 0, "decoder"), "not 'retention'")


def test_selective_scan_refuses_circuits(random_params):
    model, params = _built(random_params, "selective_scan")
    for call in (
        lambda: attention_weights(model, params),
        lambda: full_qk_circuit(model, params, 0),
        lambda: composition_scores(model, params),
    ):
        _one_line_error(call, "QK/OV circuits need .*not 'selective_scan': it has no queries")


def test_head_scores_refuse_a_stack_without_a_pattern(mixer):
    key = jax.random.PRNGKey(0)
    call = lambda: head_scores(mixer.model, mixer.params, key, batch=2, length=4, stack=mixer.stack)  # noqa: E731
    _one_line_error(call, f"model.attention='{mixer.name}', forms none")
