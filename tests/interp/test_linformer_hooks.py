"""Hook points of Linformer attention (``model.attention = "linformer"``): every one listed with
its documented shape; the recorded values are the model's computation (recomputed in float64
NumPy from other recorded values and the params); an edit of the pattern reaches the output;
QK/OV circuits read the per-head kernels; head scores refuse a pattern over projected keys.
One tiny unrolled encoder_only model (2 layers, R = 3 over 8 tokens of max_len 24).

Tolerance: float32 model against float64 references a few operations back: 1e-5 of the
reference's largest entry.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.interp import head_scores, hook_shapes, run_with_cache, run_with_patches
from tfmjax.interp.circuits import attention_weights, ov_circuit, qk_circuit
from tfmjax.interp.hooked import axes
from tfmjax.interp.names import act_name
from tfmjax.models import build, preset

B, T, R = 2, 8, 3
BLOCK = "encoder.blocks.0.attn."


@pytest.fixture(scope="module")
def built(random_params):
    cfg = preset(
        "tiny-linformer",
        vocab_size=16,
        max_len=24,
        num_layers=2,
        linformer_rank=R,
        scan_layers=False,
    )
    model = build(cfg)
    params = random_params(model, 0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(5, 16, (B, T)), jnp.int32)
    return model, params, {"tokens": tokens}


def _close(got, want):
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, atol=1e-5 * max(np.abs(want).max(), 1.0))


def test_hook_points_have_their_documented_shapes(built):
    model, params, batch = built
    N, H = model.config.num_heads, model.config.head_width
    shapes = hook_shapes(model, params, batch)
    want = {
        "hook_q": (B, T, N, H),
        "hook_k": (B, T, N, H),
        "hook_v": (B, T, N, H),
        "hook_k_proj": (B, R, N, H),
        "hook_v_proj": (B, R, N, H),
        "hook_pattern": (B, N, T, R),
        "hook_z": (B, T, N, H),
    }
    for name, shape in want.items():
        assert tuple(shapes[BLOCK + name]) == shape, name


def test_recorded_values_are_the_models_computation(built):
    model, params, batch = built
    logits, cache = run_with_cache(model, params, batch)
    np.testing.assert_allclose(logits, model.apply(params, batch), rtol=1e-5, atol=1e-5)
    a = lambda n: np.asarray(cache[BLOCK + n], np.float64)  # noqa: E731
    p = params["params"]["encoder"]["layer_0"]["attention"]
    E, F = (np.asarray(p[n], np.float64)[:, :T] for n in ("proj_e", "proj_f"))
    _close(a("hook_k_proj"), np.einsum("RT,BTKH->BRKH", E, a("hook_k")))
    _close(a("hook_v_proj"), np.einsum("RT,BTKH->BRKH", F, a("hook_v")))
    logits = np.einsum("BTNH,BRNH->BNTR", a("hook_q"), a("hook_k_proj"))
    logits /= np.sqrt(model.config.head_width)
    pattern = np.exp(logits - logits.max(-1, keepdims=True))
    _close(a("hook_pattern"), pattern / pattern.sum(-1, keepdims=True))
    _close(a("hook_z"), np.einsum("BNTR,BRNH->BTNH", a("hook_pattern"), a("hook_v_proj")))


def test_an_edit_of_the_pattern_reaches_the_output(built):
    """A uniform pattern: each query's output is the mean of the projected values."""
    model, params, batch = built
    uniform = lambda x: jnp.full_like(x, 1 / R)  # noqa: E731
    logits, cache = run_with_patches(
        model,
        params,
        batch,
        {BLOCK + "hook_pattern": uniform},
        names=[BLOCK + "hook_v_proj", BLOCK + "hook_z"],
    )
    mean = np.asarray(cache[BLOCK + "hook_v_proj"], np.float64).mean(axis=1)  # [B,N,H]
    _close(cache[BLOCK + "hook_z"], np.broadcast_to(mean[:, None], (B, T, *mean.shape[1:])))
    assert float(jnp.max(jnp.abs(logits - model.apply(params, batch)))) > 1e-3


def test_qk_ov_circuits_apply_and_head_scores_refuse(built):
    model, params, _ = built
    p = params["params"]["encoder"]["layer_1"]["attention"]
    w = attention_weights(model, params, "encoder", 1)
    _close(
        qk_circuit(w).full(), np.einsum("DNH,ENH->NDE", p["query"]["kernel"], p["key"]["kernel"])
    )
    _close(
        ov_circuit(w).full(), np.einsum("DNH,NHE->NDE", p["value"]["kernel"], p["out"]["kernel"])
    )
    with pytest.raises(ValueError, match="attends to projected keys") as info:
        head_scores(model, params, jax.random.key(0), stack="encoder", length=4)
    assert "\n" not in str(info.value)


def test_short_names_and_axes():
    """``act_name("k_proj", 0)`` is the attention's hook; the projected rows sit where
    Nyström's landmarks do (axis 1), heads on axis 2; the pattern's queries on axis 2."""
    assert act_name("k_proj", 0) == "blocks.0.attn.hook_k_proj"
    assert axes("encoder.blocks.0.attn.hook_v_proj") == (1, 2)
    assert axes("encoder.blocks.0.attn.hook_pattern") == (2, 1)


def test_hooks_cost_nothing_when_off(built, monkeypatch, hooks_off):
    """The plain apply lowers to the same program as one whose hooks are identities and
    whose pattern is never wanted (as test_hooks does for the other variants)."""
    model, params, batch = built
    lowered = lambda: jax.jit(model.apply).lower(params, batch).as_text()  # noqa: E731
    with_hooks = lowered()
    with monkeypatch.context() as m:  # the comparison sees the pattern's tap when it is on
        m.setattr("tfmjax.layers.linformer_attention.wanted", lambda _, n: n == "hook_pattern")
        assert lowered() != with_hooks
    hooks_off("tfmjax.layers.linformer_attention")
    assert lowered() == with_hooks
