"""FlashAttention in Pallas: forward, dK/dV and dQ kernels behind ``jax.custom_vjp``.

This module holds the block sizes, the block specs, the ``custom_vjp`` wiring and the
platform dispatch; the kernel bodies are in :mod:`tfmjax.kernels.pallas_kernels`.

FlashAttention (Dao et al. 2022, 2023): one program per (batch, query head, query
block) keeps the running max ``m``, denominator ``l`` and unnormalised output in
float32 while it loops over the key blocks that block can see; it writes ``O`` and
the log-sum-exp ``lse = m + log l``. The backward recomputes ``P = exp(S - lse)``
(FlashAttention-2): a dK/dV kernel (one program per batch, key/value head, key block,
looping over the ``G`` query heads of the group and their query blocks; it works on
``S^T`` so that all its matmuls are in natural layout and ``lse`` is a lane-dense row)
and a dQ kernel (one program per batch, query head, query block, looping over key
blocks). ``delta = rowsum(dO * O)`` is a plain XLA reduction. No atomics, no T x S
buffers; dK/dV of a group are summed in-kernel, so nothing is repeated per query head.

Backends (kernel flavours):
  * ``"cuda"`` / ``"gpu"`` / ``"rocm"``: **Triton** (``jax.experimental.pallas.triton``), the
    portable GPU lowering of jax 0.10 (any CUDA GPU; Mosaic GPU, jax's other GPU backend, is
    Hopper/Blackwell-only and needs a different, warp-group kernel style). Custom-call
    target ``__gpu$xla.gpu.triton``, :func:`tfmjax.compat.triton_custom_call_target` (not on
    ``jax.export``'s stable list: export with
    ``jax.export.DisabledSafetyCheck.custom_call(triton_custom_call_target())``). With
    ``TFMJAX_PALLAS_GPU=mosaic`` a call the Hopper kernels take lowers to them instead
    (:mod:`tfmjax.kernels.mosaic_attention`, :func:`~tfmjax.kernels.mosaic_attention.gpu_kernel`).
  * ``"tpu"``: **Mosaic TPU** (``jax.experimental.pallas.tpu``), the only TPU backend.
    Custom-call target ``tpu_custom_call`` (on the stable list).
  * ``"cpu"``: the same kernels with ``interpret=True`` (slow, for tests): plain HLO, each
    grid a ``while`` loop named after its kernel (``tfmjax_flash_fwd/while``...).

How the flavour is chosen: with ``platform=None`` (the default, and what
``tfmjax.kernels.attention(impl="pallas")`` and models pass) it is chosen when the
computation is **lowered**, not from the default backend at trace time: :func:`attention`
wraps the flavours in ``jax.lax.platform_dependent(q, k, v, cpu=..., cuda=..., rocm=...,
tpu=...)`` (forward and backward alike: each branch holds its own ``custom_vjp``), and
lowering for one platform keeps that platform's branch only. So
``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` or ``jax.export`` for
``("tpu",)`` from a CPU host carries Triton or Mosaic kernels and no interpreter. Under
``jit`` every flavour is traced (about 0.1 s each per new shape; traced kernels are cached
per shape and options); an eager call evaluates the platform index and traces the default
backend's flavour only. An explicit ``platform=`` builds that flavour alone (no dispatch;
lowering it for another platform fails). A joint multi-platform lowering (e.g.
``lowering_platforms=("cpu", "cuda")``) is not supported: jax lowers every ``pallas_call``
of the module for each of its platforms, and each flavour's call lowers for its own only.

Features: causal masks and sliding windows skip whole blocks (the loop runs only over
the needed key blocks, and only blocks on the edge of the visible band build a mask);
the sparse patterns of :mod:`tfmjax.kernels.masks` -- strided (Child et al. 2019) and
global tokens (Beltagy et al. 2020) -- with the block ranges of
:func:`~tfmjax.kernels.block_geometry.pattern_ranges` (a stride visits the whole causal range,
global key blocks are an extra masked range, a block holding global queries sees all);
segment ids (padding and packing); GQA/MQA by index mapping (a query head reads key/value
head ``n // G``; nothing is repeated); ALiBi slopes applied in-kernel per block; ``T``
and ``S`` padded up to the blocks (padded keys masked, padded queries dropped); ``H``
padded to a power of two. Block geometry and masks are those of
:mod:`tfmjax.kernels.block_geometry` (shared with :mod:`tfmjax.kernels.blockwise`:
:func:`~tfmjax.kernels.block_geometry.block_range`,
:func:`~tfmjax.kernels.block_geometry.block_mask`, i.e. :func:`tfmjax.kernels.masks.allowed`).

Limits: the loops over blocks run inside each program, over refs that hold the whole
sequence of one head (forward and dQ: K and V; dK/dV: Q, dO of the group) — on GPU that
is global memory read block by block; on TPU those refs are VMEM blocks, so with the
default 16-32 MiB of scoped VMEM this suits S up to a few thousand at H=128 (longer
sequences want jax's grid-over-KV TPU pipeline, ``ops/tpu/flash_attention.py``). Block
shapes follow TPU tiling (multiples of 8 x 128 or full dims) and Triton's powers of two.
A traced ``q_offset`` (decoding) is supported but disables block skipping. ALiBi slopes,
segment ids and ``q_offset`` get no gradient. Lowering for both platforms is tested on
CPU (CI has no device). Triton has run on an H100 and an H200 (jax 0.11.2):
``tests/kernels/test_gpu.py`` (block sizes 16-64; fp32 at ``jax_default_matmul_precision=
"highest"``, bf16) passed there, and at the default precision (TF32 dots) fp32 errors are
~1e-3. Speed against cuDNN: bench/README.md (0.3-0.6x). Lowering for cuda on a host
without a GPU needs :func:`tfmjax.compat.gpu_lowering_target` on jax 0.11. Mosaic TPU has
not been compiled or run (no TPU).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tfmjax.kernels.pallas_kernels import (
    KernelStatic,
    dkv_kernel,
    dq_kernel,
    fwd_kernel,
    pow2,
)
from tfmjax.kernels.pallas_tuning import (
    DEFAULT_LAUNCH,
    GPU_PLATFORMS,
    BlockSizes,
    Launch,
    lowering_gpu_kind,
    triton_settings,
)
from tfmjax.kernels.platforms import PALLAS_FLAVOUR

__all__ = ["BlockSizes", "Launch", "attention"]


def _extras_specs(st: KernelStatic, q_seg_spec, kv_seg_spec, slope_spec):
    specs = [pl.BlockSpec((1, 1), lambda b, h, i: (0, 0))]
    if st.has_seg:
        specs += [q_seg_spec, kv_seg_spec]
    if st.has_alibi:
        specs.append(slope_spec)
    return specs


def _extras(offset, q_seg, kv_seg, slopes):
    return (
        [offset]
        + ([q_seg, kv_seg] if q_seg is not None else [])
        + ([slopes] if slopes is not None else [])
    )


def _query_block_specs(st: KernelStatic, bq: int, Sp: int, Hp: int):
    """Block specs of a grid over (batch b, query head h, query block i), as the forward
    and dQ kernels use: ``q``-shaped blocks, the whole K/V of head ``h // G``, per-row
    statistics, and the extras (offset, segment ids, ALiBi slope)."""
    G = st.groups
    q_spec = pl.BlockSpec((None, None, bq, Hp), lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, Sp, Hp), lambda b, h, i: (b, lax.div(h, G), 0, 0))
    row_spec = pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0))
    extras = _extras_specs(
        st,
        pl.BlockSpec((None, bq, 1), lambda b, h, i: (b, i, 0)),
        pl.BlockSpec((None, 1, Sp), lambda b, h, i: (b, 0, 0)),
        pl.BlockSpec((None, 1, 1), lambda b, h, i: (h, 0, 0)),
    )
    return q_spec, kv_spec, row_spec, extras


def _forward(st: KernelStatic, q, k, v, offset, q_seg, kv_seg, slopes):
    B, N, Tp, Hp = q.shape
    Sp = k.shape[2]
    bq, bk, _, nk = st.geometry(st.blocks.block_q, st.blocks.block_k)
    q_spec, kv_spec, row_spec, extras = _query_block_specs(st, bq, Sp, Hp)
    return st.call(
        functools.partial(fwd_kernel, st=st, bq=bq, bk=bk, nk=nk),
        "fwd",
        grid=(B, N, Tp // bq),
        in_specs=[q_spec, kv_spec, kv_spec] + extras,
        out_specs=[q_spec, row_spec],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((B, N, Tp, 1), jnp.float32),
        ],
        name="tfmjax_flash_fwd",
    )(q, k, v, *_extras(offset, q_seg, kv_seg, slopes))


def _backward(st: KernelStatic, res, d_out):
    q, k, v, offset, q_seg, kv_seg, slopes, out, lse = res
    B, N, Tp, Hp = q.shape
    K, Sp, G = k.shape[1], k.shape[2], st.groups
    delta = jnp.einsum("BNTH,BNTH->BNT", out.astype(jnp.float32), d_out.astype(jnp.float32))[
        ..., None
    ]
    d_out = d_out.astype(q.dtype)
    extra_args = _extras(offset, q_seg, kv_seg, slopes)

    # dQ: one program per (b, query head n, query block i), looping over key blocks.
    bq, bk, _, nk = st.geometry(st.blocks.block_q_dq, st.blocks.block_k_dq)
    q_spec, kv_spec, row_spec, extras = _query_block_specs(st, bq, Sp, Hp)
    dq = st.call(
        functools.partial(dq_kernel, st=st, bq=bq, bk=bk, nk=nk),
        "dq",
        grid=(B, N, Tp // bq),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec] + extras,
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        name="tfmjax_flash_dq",
    )(q, k, v, d_out, lse, delta, *extra_args)

    # dK, dV: one program per (b, key/value head h, key block j), looping over the G
    # query heads h*G .. h*G+G-1 and their query blocks. Row statistics and segment ids
    # are transposed for the kernel's S^T orientation: lse, delta [B,N,1,Tp] (lane-dense
    # rows), q_seg [B,1,Tp], kv_seg [B,Sp,1].
    bq, bk, nq, _ = st.geometry(st.blocks.block_q_dkv, st.blocks.block_k_dkv)
    group_spec = pl.BlockSpec((None, G, Tp, Hp), lambda b, h, j: (b, h, 0, 0))
    group_rows = pl.BlockSpec((None, G, 1, Tp), lambda b, h, j: (b, h, 0, 0))
    kv_spec = pl.BlockSpec((None, None, bk, Hp), lambda b, h, j: (b, h, j, 0))
    extras = _extras_specs(
        st,
        pl.BlockSpec((None, 1, Tp), lambda b, h, j: (b, 0, 0)),
        pl.BlockSpec((None, bk, 1), lambda b, h, j: (b, j, 0)),
        pl.BlockSpec((G, 1, 1), lambda b, h, j: (h, 0, 0)),
    )
    rows_t = lambda x: jnp.swapaxes(x, -1, -2)  # noqa: E731
    extra_args = _extras(
        offset,
        None if q_seg is None else rows_t(q_seg),
        None if kv_seg is None else rows_t(kv_seg),
        slopes,
    )
    dk, dv = st.call(
        functools.partial(dkv_kernel, st=st, bq=bq, bk=bk, nq=nq),
        "dkv",
        grid=(B, K, Sp // bk),
        in_specs=[group_spec, kv_spec, kv_spec, group_spec, group_rows, group_rows] + extras,
        out_specs=[kv_spec, kv_spec],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        name="tfmjax_flash_dkv",
    )(q, k, v, d_out, rows_t(lse), rows_t(delta), *extra_args)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st, q, k, v, offset, q_seg, kv_seg, slopes):
    return _forward(st, q, k, v, offset, q_seg, kv_seg, slopes)[0]


def _flash_fwd(st, q, k, v, offset, q_seg, kv_seg, slopes):
    out, lse = _forward(st, q, k, v, offset, q_seg, kv_seg, slopes)
    return out, (q, k, v, offset, q_seg, kv_seg, slopes, out, lse)


def _flash_bwd(st, res, d_out):
    dq, dk, dv = _backward(st, res, d_out)
    slopes = res[6]
    return dq, dk, dv, None, None, None, None if slopes is None else jnp.zeros_like(slopes)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _platform(platform: str | None) -> str:
    """The kernel flavour of a platform name: ``"cpu"`` (interpret), ``"cuda"`` (Triton, also
    for ``"gpu"``/``"rocm"``) or ``"tpu"`` (Mosaic); None: the default backend's."""
    platform = (platform or jax.default_backend()).lower()
    if platform in GPU_PLATFORMS:
        return "cuda"
    if platform in ("cpu", "tpu"):
        return platform
    raise ValueError(
        f"pallas attention: unknown platform {platform!r}; "
        "use 'cpu' (interpret mode), 'cuda'/'gpu' (Triton) or 'tpu' (Mosaic)"
    )


def _static_offset(q_offset):
    try:
        return int(q_offset)
    except (jax.errors.ConcretizationTypeError, TypeError):
        return None


def _triton_blocks_ok(blocks: BlockSizes) -> bool:
    return min(dataclasses.astuple(blocks)) >= 16


def _check_triton_blocks(blocks: BlockSizes):
    if not _triton_blocks_ok(blocks):
        raise ValueError(f"pallas attention on GPU (Triton) needs blocks >= 16, got {blocks}")


def attention(
    q,
    k,
    v,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    window,
    alibi_slopes,
    bias,
    q_offset,
    scale,
    stride: int | None = None,
    global_tokens: int = 0,
    random_blocks=None,
    block_sizes: BlockSizes | None = None,
    launch: Launch | None = None,
    platform: str | None = None,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]`` with the Pallas kernels; the mask
    options (``causal``, ``window``, ``stride``, ``global_tokens``, ``random_blocks``, segment
    ids) are those of :mod:`tfmjax.kernels.masks`.

    ``platform`` picks the kernels. None (default): chosen when the computation is lowered,
    with ``lax.platform_dependent`` -- Triton for ``cuda``/``rocm``, Mosaic for ``tpu``, the
    interpreter for ``cpu`` -- so ``jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))``
    or ``jax.export`` for one platform from any host keeps only that platform's kernels
    (under ``jit`` every flavour is traced, only the lowered one is kept; an eager call runs
    the default backend's alone). ``"cpu"``, ``"cuda"``/``"gpu"``/``"rocm"`` or ``"tpu"``:
    build that flavour only, with no dispatch (lowering it for another platform fails).

    ``block_sizes`` (default: :meth:`BlockSizes.for_platform` of each flavour; on cuda the
    measured row of :func:`~tfmjax.kernels.pallas_tuning.triton_settings` where there is one)
    applies to every flavour; blocks under 16, which Triton cannot take, leave
    ``platform=None`` without a GPU flavour (lowering for ``cuda``/``rocm`` then fails; on a
    GPU host this raises at once). ``launch``: the Triton kernels' warps and stages (default:
    the measured row's with default blocks, else ``DEFAULT_LAUNCH``).
    """
    if bias is not None:
        raise ValueError(
            "impl='pallas' takes structured masks only; a dense bias needs "
            "impl='xla' or 'reference'"
        )
    kw = dict(
        causal=causal,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        window=window,
        alibi_slopes=alibi_slopes,
        q_offset=q_offset,
        scale=scale,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
        block_sizes=block_sizes,
        launch=launch,
    )
    if platform is not None:
        return _attention(_platform(platform), q, k, v, **kw)
    flavours = {}  # one callable per flavour: cuda and rocm share a branch
    for name in dict.fromkeys(PALLAS_FLAVOUR.values()):
        blocks = block_sizes or BlockSizes.for_platform(name, q.shape[-1])
        if name == "cuda" and not _triton_blocks_ok(blocks):
            if jax.default_backend() in GPU_PLATFORMS:
                _check_triton_blocks(blocks)
            continue
        flavours[name] = functools.partial(_attention, name, **kw)
    branches = {p: flavours[name] for p, name in PALLAS_FLAVOUR.items() if name in flavours}
    # q, k, v go through as operands; the rest is closed over (a Python q_offset stays
    # static, so block skipping survives).
    return lax.platform_dependent(q, k, v, **branches)


def _attention(
    platform: str,
    q,
    k,
    v,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    window,
    alibi_slopes,
    q_offset,
    scale,
    stride,
    global_tokens,
    random_blocks,
    block_sizes: BlockSizes | None,
    launch: Launch | None,
):
    """The kernels of one flavour (``platform``: ``"cpu"``, ``"cuda"`` or ``"tpu"``); on
    ``cuda`` the Mosaic GPU kernels where :func:`gpu_kernel` picks them."""
    if platform == "cuda":
        import tfmjax.kernels.mosaic_attention as mosaic_attention

        kernel, _ = mosaic_attention.gpu_kernel(
            q,
            k,
            window=window,
            stride=stride,
            global_tokens=global_tokens,
            random_blocks=random_blocks,
            alibi_slopes=alibi_slopes,
            q_offset=q_offset,
        )
        if kernel == "mosaic":
            return mosaic_attention.attention(
                q,
                k,
                v,
                q_segment_ids,
                kv_segment_ids,
                causal=bool(causal),
                scale=float(scale),
                q_offset=int(q_offset),
            )
    if platform == "cuda" and block_sizes is None:  # the measured row, else the defaults
        T, S, H = q.shape[1], k.shape[1], q.shape[-1]
        blocks, tuned, _ = triton_settings(T, S, H, bool(causal), lowering_gpu_kind())
        launch = launch or tuned
    else:
        blocks = block_sizes or BlockSizes.for_platform(platform, q.shape[-1])
    if platform == "cuda":
        _check_triton_blocks(blocks)
    static_offset = _static_offset(q_offset)
    return _kernels(
        q,
        k,
        v,
        q_segment_ids,
        kv_segment_ids,
        alibi_slopes,
        q_offset if static_offset is None else None,
        platform=platform,
        causal=bool(causal),
        window=None if window is None else int(window),
        stride=None if stride is None else int(stride),
        global_tokens=int(global_tokens),
        random_blocks=random_blocks,
        scale=float(scale),
        blocks=blocks,
        launch=launch or DEFAULT_LAUNCH,
        static_offset=static_offset,
    )


# A jit of its own so that tracing the kernels is cached: a call with the same shapes and
# options (the layers of an unrolled model, a re-traced step) reuses the traced kernels.
@functools.partial(
    jax.jit,
    static_argnames=(
        "platform",
        "causal",
        "window",
        "stride",
        "global_tokens",
        "random_blocks",
        "scale",
        "blocks",
        "launch",
        "static_offset",
    ),
)
def _kernels(
    q,
    k,
    v,
    q_segment_ids,
    kv_segment_ids,
    alibi_slopes,
    q_offset,
    *,
    platform,
    causal,
    window,
    stride,
    global_tokens,
    random_blocks,
    scale,
    blocks,
    launch,
    static_offset,
):
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    st = KernelStatic(
        causal=causal,
        window=window,
        scale=scale,
        q_len=T,
        kv_len=S,
        static_offset=static_offset,
        has_seg=q_segment_ids is not None,
        has_alibi=alibi_slopes is not None,
        groups=N // K,
        blocks=blocks,
        launch=launch,
        platform=platform,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
    )
    Tp, Sp = st.padded_lens
    Hp = max(pow2(H), 16 if platform == "cuda" else 1)

    def pad(x, length):  # [B,L,heads,H] -> [B,heads,Lp,Hp], zero padded
        x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, Hp - H)))
        return x.transpose(0, 2, 1, 3)

    q_seg = kv_seg = None
    if q_segment_ids is not None:
        q_seg = jnp.pad(q_segment_ids.astype(jnp.int32), ((0, 0), (0, Tp - T)))[:, :, None]
        kv_seg = jnp.pad(kv_segment_ids.astype(jnp.int32), ((0, 0), (0, Sp - S)))[:, None, :]
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.astype(jnp.float32).reshape(N, 1, 1)
    offset = jnp.asarray(static_offset if q_offset is None else q_offset, jnp.int32).reshape(1, 1)
    out = _flash(st, pad(q, Tp), pad(k, Sp), pad(v, Sp), offset, q_seg, kv_seg, slopes)
    return out.transpose(0, 2, 1, 3)[:, :T, :, :H]
