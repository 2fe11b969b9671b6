"""The attention entry point (docs/design.md, "Attention kernels"): platform dispatch over
the implementations.

``attention(q, k, v, *, causal, q_segment_ids, kv_segment_ids, window, stride,
global_tokens, random_blocks, alibi_slopes, bias, q_offset, scale, impl)`` with ``q [B,T,N,H]`` and
``k, v [B,S,K,H]`` (K divides N) returns ``[B,T,N,H]``. Every ``impl`` has the
semantics of ``impl="reference"`` (``"cudnn"`` for the masks it takes, and refuses the
rest); :func:`choose_impl` says what ``"auto"`` picks on one platform.

How the platform is chosen: not from ``jax.default_backend()`` at trace time but when the
computation is lowered, through ``jax.lax.platform_dependent`` (branches ``cpu``, ``cuda``,
``rocm``, ``tpu``; forward and backward alike), so ``jit(...).lower(lowering_platforms=
("cuda",))`` or ``jax.export`` for ``("tpu",)`` from a CPU host builds that platform's code:

* ``impl="pallas"``: the kernel flavour -- Triton on cuda/rocm, Mosaic on tpu, the
  interpreter on cpu (see :mod:`tfmjax.kernels.pallas_attention`).
* ``impl="auto"``: :func:`choose_impl` for each platform, from :data:`AUTO_TABLE` (per
  platform and length); when they differ (no bias: pallas on cuda/rocm/tpu but xla for a
  one-token query on cuda, xla or blockwise on cpu by length) each platform's choice is a
  branch, pallas and cudnn branches with their platform fixed. When all platforms agree (a
  dense ``bias``: xla everywhere) there is no dispatch.
* ``impl="cudnn"``: cuDNN's fused attention when lowered for ``cuda``; for any other
  platform, lowering raises a one-line ConfigError (see
  :mod:`tfmjax.kernels.cudnn_attention`).
* ``"reference"``, ``"xla"``, ``"blockwise"`` are the same code on every platform.

Under ``jit`` every branch is traced (only the lowered platform's is kept); an eager call
evaluates the platform and runs the default backend's branch alone. One platform per
lowering: a joint ``lowering_platforms=("cpu", "cuda")`` fails for pallas (see there).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import math
import numbers

import jax

from tfmjax.kernels.masks import RandomBlocks
from tfmjax.kernels.pallas_tuning import gpu_family, lowering_gpu_kind
from tfmjax.kernels.platforms import LOWERING_PLATFORMS, PALLAS_FLAVOUR

IMPLS = ("auto", "reference", "xla", "blockwise", "pallas", "cudnn")

# Module holding each implementation's ``attention`` function (imported lazily).
_MODULES = {
    "reference": "tfmjax.kernels.reference",
    "xla": "tfmjax.kernels.xla",
    "blockwise": "tfmjax.kernels.blockwise",
    "pallas": "tfmjax.kernels.pallas_attention",
    "cudnn": "tfmjax.kernels.cudnn_attention",
}


# Length from which "auto" prefers the blockwise path on CPU: both T and S must reach it.
# Measured on a 2-core CPU (N=8, H=64, causal fp32, xla vs blockwise, interleaved medians;
# bench/attention.py for long T). Speed of blockwise relative to xla: B=1: 1.4-1.6x at
# T=128..512, 4-6x at T=1024; B=8..32, T=64..256, fwd+bwd: 0.6-1.1x; B=16, T=512:
# 1.5-2.6x; decoding (T=1..8 against S=512..2048): 0.6-0.8x. Hence 512, on min(T, S):
# a short query block against a long cache stays on xla.
BLOCKWISE_MIN_LEN_CPU = 512

# What "auto" runs on each platform: ``(from_length, impl)`` rows in increasing order; the
# last row whose ``from_length <= min(T, S)`` applies. Where the numbers come from:
# * cpu: measured on a 2-core CPU (:data:`BLOCKWISE_MIN_LEN_CPU`).
# * cuda: one query row (a decode step, ``T = 1``) runs xla, longer queries Pallas, and from
#   1024 cuDNN where it may run. On an H200 (bench/README.md: width 768, 12 layers, bf16,
#   batch 1) a decode step through the Pallas kernel, which pads the query row to a tile of
#   16, took 0.85 / 1.44 / 4.57 ms at a 1k / 4k / 16k cache and through xla 0.67 / 0.77 /
#   1.06 ms (MLA's 288-wide latent heads: 15.8 against 1.09 ms at 16k), while Pallas
#   prefilled 4.5-6.4x faster at 4k-16k. On the same H200 and an H100 (bf16, H=128,
#   B*T = 16k tokens, T = 1k-16k, causal and full) cuDNN's forward+backward ran 1.7-3.2x
#   faster than Pallas (1.81 against 3.09 ms at T=1024 causal; 7.25 against 20.2 at 16k),
#   and GPT-2 small trained 4.5% faster with it. Below 1024 nothing was measured: Pallas,
#   the choice made before. cuDNN's masks take only one segment followed by padding per
#   row, and segment ids are traced, so "auto" picks it only for calls without segment
#   ids or traced inside :func:`trailing_padding` (the training and evaluation steps, whose
#   every batch the host checked), at ``q_offset = 0``, with masks it can express, heads up
#   to 128 wide, on the GPUs of :data:`CUDNN_FAMILIES` (where it was measured); every other
#   call (generation, packed or left-padded batches, other GPUs) keeps Pallas.
# * rocm, tpu: not measured (no such device yet); Pallas, the choice made before this
#   table existed.
# A dense bias always runs "xla". A row naming an implementation that cannot take the call
# falls back: "cudnn" (outside cuda, or a mask it cannot express) to "pallas", "pallas"
# (not importable) to the cpu row.
# The GPU families (tfmjax.kernels.pallas_tuning.gpu_family) and head widths for which "auto"
# may pick cuDNN: where it was measured (pre-Hopper cuDNN takes heads up to 128 only).
# Elsewhere a cudnn row falls back to Pallas.
CUDNN_FAMILIES = ("hopper",)
CUDNN_AUTO_MAX_HEAD = 128


def cudnn_measured_on(device_kind: str | None, head_width: int) -> bool:
    """Whether "auto" may pick cuDNN on a GPU of ``device_kind`` for heads ``head_width``
    wide (:data:`CUDNN_FAMILIES`, :data:`CUDNN_AUTO_MAX_HEAD`)."""
    return gpu_family(device_kind) in CUDNN_FAMILIES and head_width <= CUDNN_AUTO_MAX_HEAD


AUTO_TABLE: dict[str, tuple[tuple[int, str], ...]] = {
    "cpu": ((0, "xla"), (BLOCKWISE_MIN_LEN_CPU, "blockwise")),
    "cuda": ((0, "xla"), (2, "pallas"), (1024, "cudnn")),
    "rocm": ((0, "pallas"),),
    "tpu": ((0, "pallas"),),
}


# The promise of :func:`trailing_padding`, read when a call is traced.
_TRAILING_PADDING = contextvars.ContextVar("tfmjax_trailing_padding", default=False)


@contextlib.contextmanager
def trailing_padding():
    """While open, the attention calls traced promise that their segment ids hold one
    segment followed by padding in every row (ids ``1 .. 1 0 .. 0``), as
    ``model.check_batch(batch, trailing_padding=True)`` checked of every batch on the host.
    "auto" may then pick cuDNN (:data:`AUTO_TABLE`), whose masks take only that form. Read at
    trace time: see :func:`traced_with_trailing_padding`."""
    token = _TRAILING_PADDING.set(True)
    try:
        yield
    finally:
        _TRAILING_PADDING.reset(token)


def traced_with_trailing_padding(fn):
    """``fn``, traced inside :func:`trailing_padding` (wrap it before ``jax.jit``): how the
    training and evaluation steps make the promise their host checks keep."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with trailing_padding():
            return fn(*args, **kwargs)

    return traced


def choose_impl(
    impl: str,
    *,
    q_len: int,
    kv_len: int,
    has_bias: bool = False,
    backend: str | None = None,
    cudnn_ok: bool = False,
) -> str:
    """The concrete implementation that ``impl`` resolves to for these shapes on ``backend``
    (a platform name; None: the default backend, i.e. what an eager call runs), from
    :data:`AUTO_TABLE`. ``cudnn_ok``: cuDNN can express this call's masks (see
    :func:`tfmjax.kernels.cudnn_attention.unsupported`); without it "auto" never picks
    "cudnn". :func:`attention` asks this for every platform in :data:`LOWERING_PLATFORMS`."""
    if impl not in IMPLS:
        raise ValueError(f"attention impl={impl!r} is not one of {IMPLS}")
    if impl != "auto":
        return impl
    if has_bias:
        return "xla"  # a dense bias is the reference paths' escape hatch
    platform = backend or jax.default_backend()
    platform = "cuda" if platform == "gpu" else platform
    name = _table_choice(platform, min(q_len, kv_len))
    if name == "cudnn" and not (cudnn_ok and platform == "cuda"):
        name = "pallas"
    if name == "pallas" and not _available("pallas"):
        name = _table_choice("cpu", min(q_len, kv_len))
    if name == "blockwise" and not _available("blockwise"):
        name = "xla"
    return name


def cudnn_min_len() -> int | None:
    """The length from which :data:`AUTO_TABLE`'s cuda row names cuDNN (None: it does not)."""
    starts = [start for start, name in AUTO_TABLE["cuda"] if name == "cudnn"]
    return starts[0] if starts else None


def same_choice_limit(length: int) -> int:
    """The longest length that "auto" resolves as it does ``length`` on every platform of
    :data:`AUTO_TABLE` (a length that pads a shorter one to share its program, as
    generation's prompt buckets do, must not switch implementation: another kernel rounds
    otherwise). ``math.inf`` beyond the last row. Rows naming cuDNN do not count: generation
    never takes them (its calls carry segment ids without :func:`trailing_padding`'s
    promise, at a cache's traced offset)."""
    starts = sorted(
        {s for rows in AUTO_TABLE.values() for s, name in rows if s > length and name != "cudnn"}
    )
    return starts[0] - 1 if starts else math.inf


def _table_choice(platform: str, length: int) -> str:
    rows = AUTO_TABLE.get(platform, AUTO_TABLE["cpu"])
    return [name for start, name in rows if start <= length][-1]


def _available(name: str) -> bool:
    try:
        importlib.import_module(_MODULES[name])
    except ImportError:
        return False
    return True


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_pattern(window, stride, global_tokens, random_blocks, causal):
    """One-line errors for the static mask-pattern options (see :mod:`.masks`)."""
    if window is not None and window < 0:
        raise ValueError(f"window={window} must be >= 0 (or None for no window)")
    if stride is not None and not (_is_int(stride) and stride >= 1):
        raise ValueError(f"stride={stride!r} must be an int >= 1 (or None for no stride)")
    if not (_is_int(global_tokens) and global_tokens >= 0):
        raise ValueError(f"global_tokens={global_tokens!r} must be an int >= 0")
    if random_blocks is not None and not isinstance(random_blocks, RandomBlocks):
        raise ValueError(
            f"random_blocks={random_blocks!r} must be a tfmjax.kernels.masks.RandomBlocks or None"
        )
    if random_blocks is not None and not causal and random_blocks.num_blocks < 2:
        raise ValueError(
            f"random_blocks.num_blocks={random_blocks.num_blocks} leaves nothing to draw "
            "without causal: give the blocks of the longest sequence (>= 2)"
        )


def _check(q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes, bias):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"attention wants q [B,T,N,H] and k, v [B,S,K,H]; got ranks "
            f"{q.ndim}, {k.ndim}, {v.ndim}"
        )
    B, T, N, H = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != H:
        raise ValueError(f"k {k.shape} and v {v.shape} must both be [B={B}, S, K, H={H}]")
    if N % k.shape[2]:
        raise ValueError(f"query heads N={N} must be a multiple of key/value heads K={k.shape[2]}")
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("pass both q_segment_ids and kv_segment_ids, or neither")
    if q_segment_ids is not None and (
        q_segment_ids.shape != (B, T) or kv_segment_ids.shape != (B, k.shape[1])
    ):
        raise ValueError(
            f"segment ids must be q [B={B}, T={T}] and kv [B={B}, S={k.shape[1]}]; "
            f"got {q_segment_ids.shape} and {kv_segment_ids.shape}"
        )
    if alibi_slopes is not None and alibi_slopes.shape != (N,):
        raise ValueError(f"alibi_slopes must have shape [N={N}], got {alibi_slopes.shape}")
    if bias is not None and (bias.ndim != 4 or bias.shape[-2:] != (T, k.shape[1])):
        raise ValueError(f"bias must be [B|1, N|1, T={T}, S={k.shape[1]}], got {bias.shape}")


def attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    q_segment_ids=None,
    kv_segment_ids=None,
    window: int | None = None,
    stride: int | None = None,
    global_tokens: int = 0,
    random_blocks: RandomBlocks | None = None,
    alibi_slopes=None,
    bias=None,
    q_offset=0,
    scale: float | None = None,
    impl: str = "auto",
):
    """Attention of ``q [B,T,N,H]`` over ``k, v [B,S,K,H]``; returns ``[B,T,N,H]``.

    ``causal``: query at absolute position ``q_offset + t`` sees keys ``s <= q_offset + t``.
    ``q_segment_ids [B,T]``, ``kv_segment_ids [B,S]``: attend only within equal, non-zero ids
    (0 = padding). ``window``: how many past (and, if not causal, future) positions a query
    sees. ``stride``: the Sparse Transformer's strided pattern (Child et al. 2019): keys at
    distance ``|p - s| < stride`` (or ``<= window`` with a window) or at a multiple of
    ``stride``. ``global_tokens = g``: positions ``< g`` attend to and are attended by every
    position (Longformer, Beltagy et al. 2020), overriding window and stride but not causal
    masks or segment ids. ``random_blocks`` (a :class:`~tfmjax.kernels.masks.RandomBlocks`):
    BigBird's random key blocks per query block (Zaheer et al. 2020), beside a window or
    stride. Exact rules: :mod:`tfmjax.kernels.masks`. ``alibi_slopes [N]``:
    adds ``-slope * |p - s|``. ``bias [B|1,N|1,T,S]``: added to the scores. ``scale``
    defaults to ``1/sqrt(H)``. Rows that see nothing return zeros.

    ``impl="pallas"``, ``"cudnn"`` and ``"auto"`` are resolved per platform when the
    computation is lowered (see the module docstring), not from the default backend at
    trace time.
    """
    _check(q, k, v, q_segment_ids, kv_segment_ids, alibi_slopes, bias)
    _check_pattern(window, stride, global_tokens, random_blocks, causal)
    kw = dict(
        causal=causal,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
        alibi_slopes=alibi_slopes,
        bias=bias,
        q_offset=q_offset,
        scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
    )
    lengths = dict(q_len=q.shape[1], kv_len=k.shape[1], has_bias=bias is not None)
    if impl == "auto":
        lengths["cudnn_ok"] = _cudnn_ok(q, k, kw)
        per_platform = {p: choose_impl(impl, **lengths, backend=p) for p in LOWERING_PLATFORMS}
        if len(set(per_platform.values())) > 1:
            return _platform_dependent(per_platform, q, k, v, kw)
    name = choose_impl(impl, **lengths)
    if bias is not None and name in ("blockwise", "pallas", "cudnn"):
        raise ValueError(
            f"impl={name!r} takes structured masks only; a dense bias needs "
            "impl='xla' or 'reference'"
        )
    # "pallas", "cudnn" with no platform: the module dispatches at lowering time itself.
    return importlib.import_module(_MODULES[name]).attention(q, k, v, **kw)


def _cudnn_ok(q, k, kw) -> bool:
    """Whether "auto" may pick cuDNN for this call: some :data:`AUTO_TABLE` row names it, the
    segment ids are absent or promised in cuDNN's form (:func:`trailing_padding`), the query
    starts at 0 (not a decoding step) and cuDNN can express the masks
    (:func:`tfmjax.kernels.cudnn_attention.unsupported`)."""
    if not any(name == "cudnn" for rows in AUTO_TABLE.values() for _, name in rows):
        return False
    if kw["q_segment_ids"] is not None and not _TRAILING_PADDING.get():
        return False
    if not (_is_int(kw["q_offset"]) and kw["q_offset"] == 0):
        return False
    if not cudnn_measured_on(lowering_gpu_kind(), q.shape[-1]):
        return False
    cudnn = importlib.import_module(_MODULES["cudnn"])
    options = ("causal", "window", "stride", "global_tokens", "random_blocks")
    options += ("alibi_slopes", "bias")
    return cudnn.unsupported(q, k, **{name: kw[name] for name in options}) is None


def _platform_dependent(per_platform: dict[str, str], q, k, v, kw):
    """``lax.platform_dependent`` over the implementations ``per_platform`` names (``bias`` is
    None here). Pallas and cuDNN branches get a fixed ``platform=``, so only the lowered
    platform's kernel is built into the branch that stays; one callable per distinct choice."""
    branches, fns = {}, {}
    for platform, name in per_platform.items():
        flavour = {"pallas": PALLAS_FLAVOUR[platform], "cudnn": platform}.get(name)
        if (name, flavour) not in fns:
            extra = {} if flavour is None else {"platform": flavour}
            fns[name, flavour] = functools.partial(
                importlib.import_module(_MODULES[name]).attention, **kw, **extra
            )
        branches[platform] = fns[name, flavour]
    return jax.lax.platform_dependent(q, k, v, **branches)
