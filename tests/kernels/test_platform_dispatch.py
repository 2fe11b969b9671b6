"""The Pallas kernel is chosen when the computation is lowered, not from the default backend.

A model with ``attention_impl="pallas"`` (and ``"auto"``), traced on this CPU host and lowered
or ``jax.export``-ed for one platform, carries that platform's kernel and nothing else:

* ``cuda``: the Triton custom call (:data:`TRITON`), no ``tpu_custom_call``;
* ``tpu``: the Mosaic custom call (:data:`MOSAIC`), no Triton call;
* neither holds the interpreter: interpret mode runs a kernel's grid as an XLA ``while``
  loop in the kernel's name scope (debug location ``.../tfmjax_flash_fwd/while``), with the
  kernel body inlined as plain HLO. The ``cpu`` lowering is the positive control.

The same model still runs here (interpreted) and matches ``attention_impl="xla"``.
Lowering only runs the Pallas -> Triton / Mosaic lowerings (no device compiler).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from tfmjax import kernels
from tfmjax.compat import gpu_lowering_target, triton_custom_call_target
from tfmjax.config import ModelConfig
from tfmjax.kernels import masks, pallas_attention, reference
from tfmjax.kernels.testing import call_kwargs, random_inputs, segment_ids
from tfmjax.models import build

TRITON = triton_custom_call_target()  # custom-call target of a Pallas Triton kernel
MOSAIC = "tpu_custom_call"  # custom-call target of a Pallas Mosaic TPU kernel
KERNEL = {"cuda": TRITON, "tpu": MOSAIC}
# The interpreter's grid loop: a while loop named after the kernel (pallas_call name=...).
INTERPRETED = re.compile(r"tfmjax_flash_(fwd|dq|dkv)/while")
# fp32 interpreted Pallas vs XLA attention differ only in summation order: measured max abs
# differences 6e-7 (logits, |logit| <= 2.8) and 5e-8 (gradients, |g| <= 0.27).
ATOL = 1e-5


def _model(impl: str):
    return build(
        ModelConfig(
            family="decoder_only",
            vocab_size=32,
            d_model=32,
            num_heads=2,
            d_ff=64,
            num_layers=1,
            max_len=64,
            attention_impl=impl,
        )
    )


@pytest.fixture(scope="module")
def setup(random_params):
    batch = {"tokens": (jnp.arange(16, dtype=jnp.int32) % 32)[None]}
    params = random_params(_model("xla"))  # the same parameters for every impl
    return params, batch


def _loss(model):
    def loss(params, batch):
        return jnp.mean(model.apply(params, batch).astype(jnp.float32) ** 2)

    return loss


def _functions(impl):
    """Forward (logits) and the gradient of a loss w.r.t. the parameters."""
    model = _model(impl)
    return {"forward": model.apply, "grad": jax.grad(_loss(model))}


def _lowered_text(fn, platform, params, batch) -> str:
    with gpu_lowering_target():
        lowered = jax.jit(fn).trace(params, batch).lower(lowering_platforms=(platform,))
    return lowered.as_text(debug_info=True)


def _exported_text(fn, platform, params, batch) -> str:
    checks = [export.DisabledSafetyCheck.custom_call(TRITON)] if platform == "cuda" else []
    with gpu_lowering_target():
        exported = export.export(jax.jit(fn), platforms=(platform,), disabled_checks=checks)(
            params, batch
        )
    assert exported.platforms == (platform,)
    return exported.mlir_module()


def _contents(text):
    """What a module holds: the number of calls of each kernel, the interpreted kernels."""
    return {
        "triton calls": text.count(f"@{TRITON}("),
        "mosaic calls": text.count(f"@{MOSAIC}("),
        "interpreted": sorted({m.group(1) for m in INTERPRETED.finditer(text)}),
    }


def _assert_only_kernel_of(platform, text, num_kernels):
    want = {
        "triton calls": num_kernels if platform == "cuda" else 0,
        "mosaic calls": num_kernels if platform == "tpu" else 0,
        "interpreted": [],
    }
    assert _contents(text) == want, f"lowered for {platform}"


@pytest.mark.parametrize("kind", ["forward", "grad"])
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_lowering_keeps_only_that_platforms_kernel(setup, platform, kind):
    params, batch = setup
    text = _lowered_text(_functions("pallas")[kind], platform, params, batch)
    # one layer: the forward kernel; the gradient adds the dQ and dK/dV kernels
    _assert_only_kernel_of(platform, text, 1 if kind == "forward" else 3)


@pytest.mark.parametrize("kind", ["forward", "grad"])
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_export_keeps_only_that_platforms_kernel(setup, platform, kind):
    params, batch = setup
    text = _exported_text(_functions("pallas")[kind], platform, params, batch)
    _assert_only_kernel_of(platform, text, 1 if kind == "forward" else 3)


def test_cpu_lowering_is_the_interpreter(setup):
    """Positive control for :data:`INTERPRETED`, and no device kernel on CPU."""
    params, batch = setup
    text = _lowered_text(_functions("pallas")["grad"], "cpu", params, batch)
    assert _contents(text) == {
        "triton calls": 0,
        "mosaic calls": 0,
        "interpreted": ["dkv", "dq", "fwd"],
    }


@pytest.mark.parametrize("platform", ["cuda", "tpu", "cpu"])
def test_auto_is_chosen_per_lowering_platform(setup, platform):
    """``attention_impl="auto"`` in training (T=16): Pallas on GPU/TPU; on CPU (T=16 < 512)
    plain XLA attention, neither a kernel nor the interpreter."""
    params, batch = setup
    text = _lowered_text(_functions("auto")["grad"], platform, params, batch)
    if platform == "cpu":
        assert _contents(text) == {"triton calls": 0, "mosaic calls": 0, "interpreted": []}
    else:
        _assert_only_kernel_of(platform, text, 3)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_auto_decodes_one_token_through_xla_on_cuda(setup, platform):
    """KV-cached decoding with ``attention_impl="auto"``: the prompt's prefill runs the
    platform's kernel, while a one-token decode step runs Pallas on TPU and plain XLA attention
    on cuda (``AUTO_TABLE``: a Triton tile of 16 query rows for one row was 4.4x slower on an
    H200 at a 16k cache)."""
    params, batch = setup
    model = _model("auto")
    arrays = model.prompt_arrays(np.asarray(batch["tokens"]), np.array([16]))
    arrays = tuple(jnp.asarray(a) for a in arrays)
    with gpu_lowering_target():
        prefill = jax.jit(functools.partial(model.prefill, max_new_tokens=4))
        logits, cache = jax.eval_shape(prefill, params, arrays)
        prefill = prefill.trace(params, arrays)
        token = jax.ShapeDtypeStruct(logits.shape[:-1], jnp.int32)
        step = jax.jit(model.decode_step).trace(params, cache, token)
        texts = {
            name: traced.lower(lowering_platforms=(platform,)).as_text(debug_info=True)
            for name, traced in (("prefill", prefill), ("step", step))
        }
    _assert_only_kernel_of(platform, texts["prefill"], 1)
    _assert_only_kernel_of(platform, texts["step"], 0 if platform == "cuda" else 1)


@jax.default_matmul_precision("highest")
def test_runs_interpreted_on_cpu_and_matches_xla(setup):
    """On CPU Pallas runs interpreted and matches XLA attention, values and gradients. Full
    float32 matmuls: on a GPU (where the real Triton kernel runs) the default precision is
    TF32, and the two differed by 1e-3 on an H100; at "highest", by 7e-7."""
    params, batch = setup
    want = jax.jit(_model("xla").apply)(params, batch)
    for impl in ("pallas", "auto"):
        got = jax.jit(_model(impl).apply)(params, batch)
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=impl)
    # eager (no jit): the platform index is concrete, only the CPU branch runs
    np.testing.assert_allclose(_model("pallas").apply(params, batch), want, atol=ATOL, rtol=0)
    grads = {
        impl: jax.jit(jax.grad(_loss(_model(impl))))(params, batch) for impl in ("pallas", "xla")
    }
    for path, g in jax.tree_util.tree_leaves_with_path(grads["pallas"]):
        w = _get(grads["xla"], path)
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))


def _get(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


# ----------------------------------------------------------------------------------------
# The kernel entry points themselves.


def _kernel_inputs():
    q, k, v, _ = random_inputs(2, 24, 40, 4, 2, 16, jnp.float32)
    q_seg = segment_ids(24, [[(1, 10), (2, 14)], [(1, 24)]])
    kv_seg = segment_ids(40, [[(1, 16), (2, 20), (0, 4)], [(1, 40)]])
    return q, k, v, q_seg, kv_seg


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_every_feature_dispatches(platform):
    """Segment ids, ALiBi slopes and a traced ``q_offset`` (closed over by the branches)
    reach the lowered platform's kernels, forward and backward."""
    q, k, v, q_seg, kv_seg = _kernel_inputs()

    def loss(q, k, v, offset):
        out = kernels.attention(
            q,
            k,
            v,
            causal=True,
            window=12,
            q_segment_ids=q_seg,
            kv_segment_ids=kv_seg,
            alibi_slopes=masks.alibi_slopes(4),
            q_offset=offset,
            impl="pallas",
        )
        return jnp.sum(out**2)

    with gpu_lowering_target():
        lowered = (
            jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            .trace(q, k, v, jnp.int32(16))
            .lower(lowering_platforms=(platform,))
        )
    _assert_only_kernel_of(platform, lowered.as_text(debug_info=True), 3)


def test_explicit_platform_skips_the_dispatch():
    q, k, v, _, _ = _kernel_inputs()
    kw = call_kwargs(16, causal=True)
    dispatched = jax.make_jaxpr(lambda q, k, v: pallas_attention.attention(q, k, v, **kw))
    fixed = jax.make_jaxpr(
        lambda q, k, v: pallas_attention.attention(q, k, v, **kw, platform="tpu")
    )
    assert "platform_index" in str(dispatched(q, k, v))
    assert "platform_index" not in str(fixed(q, k, v))


def test_blocks_too_small_for_triton_leave_out_the_gpu_branch():
    """Blocks of 8 (fine for the interpreter and Mosaic) cannot be Triton's: ``platform=None``
    then has no cuda/rocm branch, so lowering for cuda fails and the rest works."""
    q, k, v, _, _ = _kernel_inputs()
    blocks = pallas_attention.BlockSizes(8, 8, 8, 8, 8, 8)
    kw = call_kwargs(16, causal=True)
    fn = jax.jit(lambda q, k, v: pallas_attention.attention(q, k, v, **kw, block_sizes=blocks))
    want = reference.attention(q, k, v, **kw)
    np.testing.assert_allclose(fn(q, k, v), want, atol=2e-5, rtol=0)
    _assert_only_kernel_of(
        "tpu", fn.trace(q, k, v).lower(lowering_platforms=("tpu",)).as_text(debug_info=True), 1
    )
    with gpu_lowering_target(), pytest.raises(NotImplementedError, match="platform_index.*cuda"):
        fn.trace(q, k, v).lower(lowering_platforms=("cuda",))
