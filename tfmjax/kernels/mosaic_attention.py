"""FlashAttention for Hopper GPUs (sm_90) in Pallas Mosaic GPU: forward, dQ and dK/dV kernels
behind ``jax.custom_vjp``; the kernel bodies are in :mod:`tfmjax.kernels.mosaic_kernels`.

The schedule is FlashAttention-3's (Shah et al. 2024) in its plainest form: per CTA one
memory warpgroup streams K/V (or Q/dO) tiles with bulk (TMA) copies through a two-slot ring
while two compute warpgroups, 64 rows each, run ``wgmma`` from shared memory and the online
softmax in registers (base 2: ``exp2`` of scores times ``scale * log2 e``). The backward is
FlashAttention-2's split: ``delta = rowsum(dO * O)`` in XLA, a dQ kernel over key blocks
and a dK/dV kernel over the group's query heads and query blocks (GQA/MQA summed
in-kernel, nothing repeated per head). Causal masks skip whole blocks; the mask is built
only on blocks that cross a CTA's diagonal or hold padding.

What it takes (:func:`unsupported` says why not, in a phrase): causal or full attention,
segment ids (padding and packing), GQA/MQA, a static ``q_offset >= 0`` (prefill with a
cache), float16/bfloat16, head widths up to 128 (padded to 64 or 128). Everything else --
ALiBi, sliding windows, the sparse patterns, a traced ``q_offset`` (a decode step), float32,
wider heads -- runs the Triton kernel (:mod:`tfmjax.kernels.pallas_attention` applies the
rule). Inputs are read in place, ``[B,T,N,H]`` (TMA copies strided tiles): nothing is
transposed; ``T`` and ``S`` are padded to whole CTAs only when they are not multiples.

``pingpong=True`` adds FlashAttention-3's ping-pong schedule to the forward: its two compute
warpgroups take turns on the tensor cores at a shared barrier, so one's softmax runs while the
other's matrix multiplies do (jax's ``attention_mgpu.py`` schedules so too). It changes the
order of nothing but the warpgroups' issues, so the bits are the same; it stays off until a GPU
measures it against the free schedule (``bench/attention_peers.py --mosaic-tiles``).

On a CPU the same kernels run in Pallas's GPU interpreter (``interpret=True``: slow, for
tests), and lowering for ``cuda`` from a CPU host builds the real Mosaic GPU module (what
``tests/kernels/test_mosaic_gpu.py`` checks without a GPU). The interpreter runs each
warpgroup as a thread that blocks in XLA:CPU callbacks: with XLA:CPU's single default device
on a 2-core host it can hang (seen with segment ids); the tests run with 8 host devices
(``tests/conftest.py``), where it does not. jax 0.10 has no GPU interpreter; :func:`available`
says whether this jax can build the kernels at all.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from tfmjax import compat
from tfmjax.kernels.pallas_kernels import pow2

MAX_HEAD_WIDTH = 128
# CUDA runtimes [12.8.0, 12.9.1) whose ptxas miscompiles the causal mask of jax's own Mosaic
# GPU attention (attention_mgpu.py refuses causal there). Every kernel here masks (causal,
# segments, ragged lengths), so on those runtimes every call runs Triton.
PTXAS_MISCOMPILES = (12080, 12091)
DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
CTA_ROWS = 128  # query rows (fwd, dQ) or keys (dK/dV) of one CTA: 2 warpgroups x 64


@functools.cache
def available() -> bool:
    """Whether this jax has Pallas Mosaic GPU with its CPU interpreter (jax >= 0.11)."""
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError:
        return False
    return hasattr(plgpu, "force_gpu_interpret_mode") and hasattr(plgpu, "kernel")


def unsupported(
    q,
    k,
    *,
    window=None,
    stride=None,
    global_tokens=0,
    random_blocks=None,
    alibi_slopes=None,
    bias=None,
    q_offset=0,
) -> str | None:
    """Why the Mosaic GPU kernels cannot compute this call (a phrase), or None when they can.
    ``q [B,T,N,H]``, ``k [B,S,K,H]``; the options are those of
    :func:`tfmjax.kernels.attention`."""
    if not available():
        return f"jax {jax.__version__} has no Pallas Mosaic GPU interpreter (needs jax >= 0.11)"
    runtime = compat.cuda_runtime_version()
    if runtime is not None and PTXAS_MISCOMPILES[0] <= runtime < PTXAS_MISCOMPILES[1]:
        return f"CUDA runtime {runtime} (its ptxas miscompiles masked Mosaic GPU attention)"
    if alibi_slopes is not None:
        return "ALiBi slopes"
    if bias is not None:
        return "a dense bias"
    if window is not None:
        return f"a sliding window (window={window})"
    if stride is not None or global_tokens or random_blocks is not None:
        return "a sparse pattern (stride, global tokens or random blocks)"
    if jnp.dtype(q.dtype) not in DTYPES or k.dtype != q.dtype:
        return f"dtype {q.dtype} (takes float16 or bfloat16)"
    if q.shape[-1] > MAX_HEAD_WIDTH:
        return f"head width {q.shape[-1]} (takes up to {MAX_HEAD_WIDTH})"
    try:
        offset = int(q_offset)
    except (jax.errors.ConcretizationTypeError, TypeError):
        return "a traced q_offset (a decode step)"
    if offset < 0:
        return f"q_offset={offset} < 0"
    return None


# Which GPU kernels ``impl="pallas"`` lowers to on cuda: "triton" (every GPU, every mask) or
# "mosaic" (the Hopper kernels of tfmjax.kernels.mosaic_attention where they take the call,
# Triton for the rest). From the environment variable TFMJAX_PALLAS_GPU, read when a call is
# traced. The default stays "triton" until the Mosaic kernels have passed
# tests/kernels/test_gpu.py on a Hopper GPU (they have run only in the CPU interpreter and
# been lowered for cuda from a CPU host so far).
PALLAS_GPU_ENV = "TFMJAX_PALLAS_GPU"
PALLAS_GPU_KERNELS = ("triton", "mosaic")
PALLAS_GPU_DEFAULT = "triton"


def gpu_kernel(q, k, **mask) -> tuple[str, str]:
    """``(kernel, why)``: the GPU kernels a call lowers to on cuda, ``"triton"`` or
    ``"mosaic"``, and a phrase saying why (what bench/ output and run headers print).
    ``mask``: ``window, stride, global_tokens, random_blocks, alibi_slopes, q_offset``."""
    wanted = os.environ.get(PALLAS_GPU_ENV, PALLAS_GPU_DEFAULT)
    if wanted not in PALLAS_GPU_KERNELS:
        raise ValueError(f"{PALLAS_GPU_ENV}={wanted!r} is not one of {PALLAS_GPU_KERNELS}")
    if wanted == "triton":
        return "triton", f"{PALLAS_GPU_ENV}={wanted}"
    why = unsupported(q, k, **mask)
    if why is not None:
        return "triton", f"Mosaic GPU does not take {why}"
    return "mosaic", f"{PALLAS_GPU_ENV}={wanted}"


def padded_head_width(H: int) -> int:
    return max(64, pow2(H))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


# ----------------------------------------------------------------------------------------
# The three kernel calls. Layouts as in mosaic_kernels: q, o, dO [B,Tp,N,Hp]; k, v
# [B,Sp,K,Hp]; lse2, delta [B,N,Tp] float32; q_seg [B,Tp], kv_seg [B,Sp] int32.


def _call(st, body, out_type, grid, grid_names, scratch_types, *args):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def entry(*refs):
        pl.run_scoped(
            lambda *scratch: body(*refs, scratch, st=st), *scratch_types, collective_axes="wg"
        )

    return plgpu.kernel(
        entry,
        out_type=out_type,
        grid=grid,
        grid_names=grid_names,
        num_threads=3,  # two compute warpgroups and the memory warpgroup
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=plgpu.InterpretGPUParams() if st.interpret else None,
    )(*args)


def _scratch(st, per_wg, rings):
    """``(per_wg, rings, full barriers, consumed barriers)`` scratch types."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    full = tuple(plgpu.Barrier(num_barriers=st.stages) for _ in rings)
    consumed = tuple(plgpu.Barrier(num_arrivals=2, num_barriers=st.stages) for _ in rings)
    return per_wg, tuple(rings), full, consumed


def _smem(shape, dtype, tiled=False):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from tfmjax.kernels.mosaic_kernels import tile_transforms

    return plgpu.SMEM(shape, dtype, transforms=tile_transforms() if tiled else ())


def _forward(st, q, k, v, q_seg, kv_seg):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from tfmjax.kernels.mosaic_kernels import ROWS, WGS, fwd_kernel

    B, Tp, N, Hp = q.shape
    f32, i32, bk = jnp.float32, jnp.int32, st.block_k
    per_wg = (
        _smem((WGS, ROWS, Hp), q.dtype, tiled=True),
        _smem((WGS, ROWS), f32),
        _smem((WGS, ROWS), i32) if st.has_seg else None,
        plgpu.Barrier(num_barriers=2 * WGS),
        plgpu.Barrier(num_arrivals=WGS) if st.pingpong else None,  # the compute turns
    )
    rings = [_smem((st.stages, bk, Hp), q.dtype, tiled=True)] * 2
    if st.has_seg:
        rings.append(_smem((st.stages, bk), i32))
    segs = (q_seg, kv_seg) if st.has_seg else ()
    return _call(
        st,
        fwd_kernel,
        [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, Tp), f32)],
        (B, N, Tp // CTA_ROWS),
        ("b", "n", "rows"),
        _scratch(st, per_wg, rings),
        q,
        k,
        v,
        *segs,
    )


def _backward(st, res, d_out):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from tfmjax.kernels.mosaic_kernels import ROWS, WGS, dkv_kernel, dq_kernel

    q, k, v, q_seg, kv_seg, out, lse2 = res
    B, Tp, N, Hp = q.shape
    Sp, K = k.shape[1], k.shape[2]
    f32, i32 = jnp.float32, jnp.int32
    delta = jnp.einsum("BTNH,BTNH->BNT", out.astype(f32), d_out.astype(f32))
    d_out = d_out.astype(q.dtype)
    segs = (q_seg, kv_seg) if st.has_seg else ()
    args = (q, k, v, d_out, lse2, delta, *segs)

    per_wg = (
        _smem((WGS, ROWS, Hp), q.dtype, tiled=True),
        _smem((WGS, ROWS, Hp), q.dtype, tiled=True),
        _smem((WGS, ROWS), f32),
        _smem((WGS, ROWS), f32),
        _smem((WGS, ROWS), i32) if st.has_seg else None,
        plgpu.Barrier(num_barriers=5 * WGS),
    )
    rings = [_smem((st.stages, st.block_k_dq, Hp), q.dtype, tiled=True)] * 2
    if st.has_seg:
        rings.append(_smem((st.stages, st.block_k_dq), i32))
    dq = _call(
        st,
        dq_kernel,
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        (B, N, Tp // CTA_ROWS),
        ("b", "n", "rows"),
        _scratch(st, per_wg, rings),
        *args,
    )

    if st.interpret:  # one interpreted kernel at a time: make dK/dV wait for dQ
        dq, args = jax.lax.optimization_barrier((dq, args))
    per_wg = (
        _smem((WGS, ROWS, Hp), q.dtype, tiled=True),
        _smem((WGS, ROWS, Hp), q.dtype, tiled=True),
        _smem((WGS, ROWS), i32) if st.has_seg else None,
        plgpu.Barrier(num_barriers=3 * WGS),
    )
    bq = st.block_q_dkv
    rings = [_smem((st.stages, bq, Hp), q.dtype, tiled=True)] * 2
    rings += [_smem((st.stages, bq), f32)] * 2
    if st.has_seg:
        rings.append(_smem((st.stages, bq), i32))
    dk, dv = _call(
        st,
        dkv_kernel,
        [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        (B, K, Sp // CTA_ROWS),
        ("b", "h", "keys"),
        _scratch(st, per_wg, rings),
        *args,
    )
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st, q, k, v, q_seg, kv_seg):
    return _forward(st, q, k, v, q_seg, kv_seg)[0]


def _flash_fwd(st, q, k, v, q_seg, kv_seg):
    out, lse2 = _forward(st, q, k, v, q_seg, kv_seg)
    return out, (q, k, v, q_seg, kv_seg, out, lse2)


def _flash_bwd(st, res, d_out):
    return (*_backward(st, res, d_out), None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


# The tile settings a caller (bench/attention_peers.py --mosaic-tiles) may choose: streamed
# rows per ring slot (keys for the forward and dQ, query rows for dK/dV) divide a CTA's 128,
# and the ring holds 2-4 slots. Defaults: MosaicStatic's.
TILE_BLOCKS = (64, 128)
TILE_STAGES = (2, 3, 4)


@functools.partial(
    jax.jit,
    static_argnames=("causal", "scale", "q_offset", "interpret", "tiles", "pingpong"),
)
def attention(
    q,
    k,
    v,
    q_segment_ids=None,
    kv_segment_ids=None,
    *,
    causal: bool,
    scale: float,
    q_offset: int = 0,
    interpret: bool = False,
    tiles: tuple[int, int, int, int] | None = None,
    pingpong: bool = False,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` (float16/bfloat16, ``H <= 128``, K divides N) ->
    ``[B,T,N,H]``: causal or full attention with optional segment ids ``[B,T]``/``[B,S]``
    (the rule of :func:`tfmjax.kernels.masks.allowed`), queries at positions
    ``q_offset + t``. ``interpret``: run in Pallas's GPU interpreter (on a CPU).
    ``tiles``: ``(block_k, block_k_dq, block_q_dkv, stages)``, each block in
    :data:`TILE_BLOCKS`, ``stages`` in :data:`TILE_STAGES` (None: the defaults).
    ``pingpong``: the forward's two compute warpgroups take turns on the tensor cores
    (FlashAttention-3's schedule; off until a GPU measures it against the free one)."""
    from tfmjax.kernels.mosaic_kernels import MosaicStatic

    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    st = MosaicStatic(
        causal=bool(causal),
        scale=float(scale),
        kv_len=S,
        offset=int(q_offset),
        has_seg=q_segment_ids is not None,
        groups=N // K,
        pingpong=bool(pingpong),
        interpret=interpret,
        **_tile_fields(tiles),
    )
    Tp, Sp, Hp = _round_up(T, CTA_ROWS), _round_up(S, CTA_ROWS), padded_head_width(H)

    def pad(x, length):  # [B,L,heads,H] -> [B,Lp,heads,Hp], zero padded (no copy if none)
        widths = ((0, 0), (0, length - x.shape[1]), (0, 0), (0, Hp - H))
        return x if not any(w for _, w in widths) else jnp.pad(x, widths)

    q_seg = kv_seg = None
    if q_segment_ids is not None:
        q_seg = jnp.pad(q_segment_ids.astype(jnp.int32), ((0, 0), (0, Tp - T)))
        kv_seg = jnp.pad(kv_segment_ids.astype(jnp.int32), ((0, 0), (0, Sp - S)))
    out = _flash(st, pad(q, Tp), pad(k, Sp), pad(v, Sp), q_seg, kv_seg)
    return out[:, :T, :, :H]


def _tile_fields(tiles) -> dict:
    if tiles is None:
        return {}
    *blocks, stages = tiles
    if len(blocks) != 3 or any(b not in TILE_BLOCKS for b in blocks) or stages not in TILE_STAGES:
        raise ValueError(
            f"mosaic attention tiles={tiles!r}: (block_k, block_k_dq, block_q_dkv, stages) "
            f"with blocks in {TILE_BLOCKS} and stages in {TILE_STAGES}"
        )
    return dict(zip(("block_k", "block_k_dq", "block_q_dkv", "stages"), tiles, strict=True))
