"""cuDNN's fused (flash) attention, through ``jax.nn.dot_product_attention(...,
implementation="cudnn")``: ``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]``.

What cuDNN computes here, with the semantics of :mod:`tfmjax.kernels.reference`:

* ``causal`` (cuDNN's causal mask is anchored at query 0: query ``t`` sees keys ``s <= t``,
  so ``q_offset`` must be 0);
* padding by segment ids, passed to cuDNN as per-row lengths ``sum(ids != 0)``. So each row
  must be **one segment followed by padding** (ids ``1 .. 1 0 .. 0``, queries and keys
  alike), as every batch of the toy tasks and text windows is; packed rows or left padding
  would be masked wrongly (``model.check_batch`` refuses such batches for ``cudnn``).
  Query rows that see nothing (padding, or a row whose keys are all padding) give zeros;
* a causal sliding ``window`` (cuDNN's window is one-sided: past positions only);
* GQA/MQA (``K`` divides ``N``: cuDNN reads each key/value head for its ``N/K`` query
  heads, nothing repeated), any ``scale``.

Everything else is refused with a one-line ValueError (:func:`unsupported` says why):
ALiBi slopes, a dense bias (T5 relative positions), strided and global-token patterns, a
window without ``causal``, inputs that are not float16/bfloat16 (cuDNN's flash attention
has no float32 kernel), head widths that are not a multiple of 8 or exceed 256 (128 before
Hopper). ``model.attention_impl = "cudnn"`` is refused for such models when the config is
built (:class:`tfmjax.config.ModelConfig`).

KV-cached decoding (a traced or non-zero ``q_offset``: a few queries against a left-padded
cache) cannot be said to cuDNN's masks; those calls run :mod:`tfmjax.kernels.xla`, where a
flash kernel has nothing to gain anyway (``T`` is 1 or a prompt).

Platforms: cuDNN exists on CUDA only. With ``platform=None`` the choice is made when the
computation is lowered (``lax.platform_dependent``, as for Pallas): for ``cuda`` the cuDNN
custom calls (``__cudnn$fmhaSoftmax`` forward, ``__cudnn$fmhaSoftmaxBackward`` backward);
for any other platform, lowering (or an eager call) raises a one-line
:class:`~tfmjax.config.ConfigError` that says to use ``auto`` or ``xla``. So a CPU host can
lower or ``jax.export`` a cuDNN model for ``cuda`` (see :mod:`tfmjax.compat` for the one
jax internal this needs), and a CPU run with ``cudnn`` stops at its first compile with that
line.

Numerics: the cuDNN kernels themselves run only on a GPU: ``tests/kernels/test_cudnn.py``
compares values and gradients with ``xla`` when one is present (passed on an H200, jax
0.11.2, 2026-11-26: GQA, a causal window, padded rows, odd lengths, T != S, bf16).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

from tfmjax import compat
from tfmjax.config import ConfigError
from tfmjax.kernels.xla import attention as xla_attention

DTYPES = (jnp.float16, jnp.bfloat16)
MAX_HEAD_WIDTH = 256  # Hopper and later; 128 before (jax checks this when it traces)


def unsupported(
    q,
    k,
    *,
    causal,
    window,
    stride=None,
    global_tokens=0,
    random_blocks=None,
    alibi_slopes=None,
    bias=None,
) -> str | None:
    """Why cuDNN's fused attention cannot compute this call (a phrase naming the option), or
    None when it can. ``q [B,T,N,H]``, ``k [B,S,K,H]``; the options are those of
    :func:`tfmjax.kernels.attention`."""
    H = q.shape[-1]
    if alibi_slopes is not None:
        return "ALiBi slopes (a per-head distance bias)"
    if bias is not None:
        return "a dense bias (e.g. T5 relative positions)"
    if stride is not None:
        return f"the strided pattern stride={stride}"
    if global_tokens:
        return f"global tokens global_tokens={global_tokens}"
    if random_blocks is not None:
        return f"BigBird's random blocks random_blocks={random_blocks.count}"
    if window is not None and not causal:
        return f"window={window} without causal (cuDNN's window is one-sided)"
    if q.dtype not in DTYPES or k.dtype != q.dtype:
        return f"q, k, v of dtypes {q.dtype}, {k.dtype} (cuDNN takes float16 or bfloat16)"
    if H % 8 or H > MAX_HEAD_WIDTH:
        return f"head width H={H} (must be a multiple of 8, at most {MAX_HEAD_WIDTH})"
    return None


def _static_offset(q_offset) -> int | None:
    try:
        return int(q_offset)
    except (jax.errors.ConcretizationTypeError, TypeError):
        return None


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
    stride=None,
    global_tokens=0,
    random_blocks=None,
    platform: str | None = None,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]`` with cuDNN's fused attention (see
    the module docstring for what it takes). ``platform=None``: cuDNN when lowered for
    ``cuda``, a ConfigError for any other platform; ``"cuda"``: the cuDNN call alone."""
    why = unsupported(
        q,
        k,
        causal=causal,
        window=window,
        stride=stride,
        global_tokens=global_tokens,
        random_blocks=random_blocks,
        alibi_slopes=alibi_slopes,
        bias=bias,
    )
    if why is not None:
        raise ValueError(f"impl='cudnn' cannot take {why}: use impl='xla' or 'pallas'")
    if _static_offset(q_offset) != 0:  # KV-cached decoding: see the module docstring
        return xla_attention(
            q,
            k,
            v,
            causal=causal,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            window=window,
            alibi_slopes=None,
            bias=None,
            q_offset=q_offset,
            scale=scale,
        )
    fused = functools.partial(
        _fused,
        causal=bool(causal),
        window=None if window is None else int(window),
        scale=float(scale),
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
    if platform is not None:
        if platform != "cuda":
            _refuse(platform)
        return fused(q, k, v)
    return jax.lax.platform_dependent(q, k, v, cuda=fused, default=_unavailable_branch)


def _fused(q, k, v, *, causal, window, scale, q_segment_ids, kv_segment_ids):
    """The cuDNN call: segment ids become per-row lengths, a causal window ``(window, 0)``."""
    kw = {}
    if q_segment_ids is not None:
        q_len = jnp.sum(q_segment_ids != 0, axis=1, dtype=jnp.int32)  # [B]
        kv_len = jnp.sum(kv_segment_ids != 0, axis=1, dtype=jnp.int32)  # [B]
        kw = dict(query_seq_lengths=q_len, key_value_seq_lengths=kv_len)
    if window is not None:
        kw["local_window_size"] = (window, 0)
    out = compat.cudnn_dot_product_attention(q, k, v, scale=scale, is_causal=causal, **kw)
    if q_segment_ids is None:
        return out  # every row sees at least one key (causal: itself)
    sees = (q_segment_ids != 0) & (kv_len > 0)[:, None]  # [B,T]
    return jnp.where(sees[:, :, None, None], out, jnp.zeros((), out.dtype))


# -- any platform but cuda: a one-line ConfigError when lowered (or called eagerly) ---------


def _refuse(platform: str):
    raise ConfigError(
        f"model.attention_impl='cudnn' is invalid here: cuDNN's fused attention runs on CUDA "
        f"GPUs only, and this program is compiled for {platform}: use 'auto' or 'xla'"
    )


def _unavailable_lowering(ctx, q):
    _refuse("/".join(ctx.module_context.platforms))


# A primitive that traces like the identity on ``q`` and refuses to be lowered or run: the
# branch ``lax.platform_dependent`` keeps for every platform without cuDNN. Under ``jit``
# every branch is traced, so the error must wait until a platform is chosen.
_unavailable_p = jex_core.Primitive("tfmjax_cudnn_unavailable")
_unavailable_p.def_abstract_eval(lambda q: q)
_unavailable_p.def_impl(lambda q: _refuse(jax.default_backend()))
mlir.register_lowering(_unavailable_p, _unavailable_lowering)
batching.defvectorized(_unavailable_p)


@jax.custom_vjp
def _unavailable(q):
    return _unavailable_p.bind(q)


_unavailable.defvjp(lambda q: (_unavailable_p.bind(q), None), lambda _, g: (g,))


def _unavailable_branch(q, k, v):
    return _unavailable(q)
