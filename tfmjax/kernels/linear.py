"""Kernelised linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"; FAVOR+ of
Choromanski et al. 2021, "Rethinking Attention with Performers").

With a positive feature map ``phi: [..., H] -> [..., F]`` (in this module ``F`` counts
features, not the FFN width it names elsewhere) the output of query ``i`` is

    z_i = phi(q_i)^T S_i / (phi(q_i)^T zeta_i + eps),
    S_i = sum_j phi(k_j) v_j^T  [F, H],   zeta_i = sum_j phi(k_j)  [F],

summed over the allowed keys ``j``: every unmasked key, or (``causal``) every unmasked
``j <= i``. Nothing ``T x S`` is ever built:

* **Non-causal**: ``S`` and ``zeta`` are global sums, O(T F H).
* **Causal**: the sequence is cut into chunks of ``chunk_size``; a ``lax.scan`` over chunks
  carries ``(S, zeta)`` of all earlier chunks (the recurrent form), and inside a chunk the
  quadratic masked form ``A = phi(Q) phi(K)^T`` handles the chunk's own keys. Memory
  O(T F H / chunk + chunk^2); the scan body is rematerialised in the backward pass, so
  only the per-chunk carries are kept. Decoding (:func:`linear_attention_step`) is the
  same scan started from a carried state.

Feature maps (:data:`FEATURE_MAPS`):

* ``"elu"``: ``phi(x) = elu(x) + 1``, F = H (Katharopoulos et al. 2020).
* ``"favor"``: FAVOR+ positive random features (Choromanski et al. 2021):
  ``phi(x) = exp(W x~ - |x~|^2 / 2) / sqrt(F)`` with ``x~ = x H^-1/4`` and ``W [F, H]``
  from :func:`favor_projection`, so that ``E[phi(q) . phi(k)] = exp(q . k / sqrt(H))``,
  the softmax kernel.

**Stabiliser.** FAVOR+ features overflow or underflow float32 for large ``|x|``. Each row
is stored as ``phi~ exp(c)`` with ``c = max_f log phi_f`` (held constant:
``stop_gradient``) and ``phi~ = exp(log phi - c)`` in ``(0, 1/sqrt(F)]``. Queries keep
their own ``c_q`` (it scales numerator and denominator alike); keys are brought to a
common scale ``m``, a running maximum of ``c_k`` over the keys absorbed so far (carried
like the row maximum of online softmax), and ``S``, ``zeta`` are stored relative to it.
``eps`` is rescaled by ``exp(-(c_q + m))`` too, so the stabilised result equals the
formula above with the plain ``phi`` exactly (up to rounding, and with the rescaled
``eps`` clipped to ``exp(+-80)``), whatever the chunking; gradients are exact because the
constants cancel. ``"elu"`` has ``c = 0``.

Layouts as in :mod:`tfmjax.kernels`: ``q [B,T,N,H]``, ``k, v [B,S,K,H]`` with K dividing N;
query head ``n`` reads key/value head ``n // G`` (``G = N / K``). The ``G`` query heads of
a group share their key/value head's ``S`` and ``zeta`` (``BTKGF,BKFH->BTKGH``): K and V
are never repeated, and the decoding state is per key/value head. Every sum is float32,
whatever the input dtype; the output has q's dtype.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

FEATURE_MAPS = ("elu", "favor")

# Running key scale before any key is seen (finite: exp(MASK_VALUE - m) == 0 and no
# inf - inf), and the clip on the exponent of the rescaled eps.
MASK_VALUE = -1e30
EPS_LOG_CLIP = 80.0


# ----------------------------------------------------------------------------------------
# Feature maps.


@functools.partial(jax.jit, static_argnames=("num_features", "head_dim"))
def favor_projection(key, num_features: int, head_dim: int):
    """FAVOR+ random matrix ``W [F, H]`` (Choromanski et al. 2021), a deterministic function
    of the ``jax.random`` key.

    Rows come in blocks of ``H`` mutually orthogonal directions (Q of the QR decomposition
    of a Gaussian ``H x H`` block, signs fixed by ``diag(R)`` so the directions are
    uniform, Mezzadri 2007); each row is then rescaled to the norm of an independent
    ``N(0, I_H)`` vector (chi-distributed), so every row is marginally ``N(0, I_H)``.
    float32.
    """
    if num_features < 1 or head_dim < 1:
        raise ValueError(
            f"favor_projection wants F >= 1 and H >= 1, got {num_features}, {head_dim}"
        )
    F, H = num_features, head_dim
    num_blocks = -(-F // H)
    keys = jax.random.split(key, num_blocks + 1)

    def block(k):
        q, r = jnp.linalg.qr(jax.random.normal(k, (H, H), jnp.float32))
        return (q * jnp.sign(jnp.diagonal(r))[None, :]).T  # rows: orthonormal directions

    directions = jnp.concatenate([block(k) for k in keys[:-1]])[:F]
    norms = jnp.linalg.norm(jax.random.normal(keys[-1], (F, H), jnp.float32), axis=-1)
    return directions * norms[:, None]


def _elu_plus_one(x):
    """``elu(x) + 1``, written ``x + 1`` or ``exp(x)`` so that it stays positive for very
    negative ``x`` (``(exp(x) - 1) + 1`` rounds to 0 below about -17 in float32)."""
    return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))


def _favor_log(x, projection):
    """``log phi(x) [..., F]`` of FAVOR+ for float32 ``x [..., H]``."""
    F, H = projection.shape
    x = x * H**-0.25
    wx = jnp.einsum("...H,FH->...F", x, projection.astype(jnp.float32))
    return wx - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True) - 0.5 * math.log(F)


def apply_feature_map(x, feature_map: str = "elu", projection=None):
    """``phi(x)``: ``[..., H] -> [..., F]`` in float32, unstabilised (the formula itself).

    ``"elu"``: ``elu(x) + 1`` (F = H). ``"favor"``: ``exp(W x~ - |x~|^2/2) / sqrt(F)``,
    ``x~ = x H^-1/4``, ``projection = W [F, H]``. (The attention functions use the
    stabilised form, which stays finite where this one under- or overflows.)
    """
    _check_feature_map(feature_map, projection, x.shape[-1])
    x = x.astype(jnp.float32)
    if feature_map == "elu":
        return _elu_plus_one(x)
    return jnp.exp(_favor_log(x, projection))


def _stabilised(x, kind, projection):
    """``(phi~ [..., F], c [...])`` with ``phi(x) = phi~ exp(c)``, ``c`` a constant
    (``stop_gradient`` of the row maximum of ``log phi``; 0 for ``"elu"``)."""
    x = x.astype(jnp.float32)
    if kind == "elu":
        return _elu_plus_one(x), jnp.zeros(x.shape[:-1], jnp.float32)
    log_phi = _favor_log(x, projection)
    c = lax.stop_gradient(jnp.max(log_phi, axis=-1))
    return jnp.exp(log_phi - c[..., None]), c


# ----------------------------------------------------------------------------------------
# Argument checks (one-line ValueErrors).


def _check_feature_map(kind, projection, H):
    if kind not in FEATURE_MAPS:
        raise ValueError(f"feature_map={kind!r} is not one of {FEATURE_MAPS}")
    if kind == "favor":
        if projection is None:
            raise ValueError("feature_map='favor' needs projection=favor_projection(key, F, H)")
        if projection.ndim != 2 or projection.shape[1] != H:
            raise ValueError(f"projection must be [F, H={H}], got {projection.shape}")
    elif projection is not None:
        raise ValueError(f"feature_map={kind!r} takes no projection (only 'favor' does)")


def _check(q, k, v, causal, kind, projection, kv_mask):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"want q [B,T,N,H], k, v [B,S,K,H]; got ranks {q.ndim}, {k.ndim}, {v.ndim}"
        )
    B, T, N, H = q.shape
    if T < 1 or k.shape[1] < 1:
        raise ValueError(f"need at least one query and one key, got T={T}, S={k.shape[1]}")
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != H:
        raise ValueError(f"k {k.shape} and v {v.shape} must both be [B={B}, S, K, H={H}]")
    if N % k.shape[2]:
        raise ValueError(f"query heads N={N} must be a multiple of key/value heads K={k.shape[2]}")
    if causal and k.shape[1] != T:
        raise ValueError(
            f"causal linear attention needs T == S (self-attention), got {T}, {k.shape[1]}"
        )
    if kv_mask is not None and kv_mask.shape != (B, k.shape[1]):
        raise ValueError(f"kv_mask must be [B={B}, S={k.shape[1]}], got {kv_mask.shape}")
    _check_feature_map(kind, projection, H)


def _check_numbers(chunk_size, eps):
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
    if not eps > 0:
        raise ValueError(f"eps={eps!r} must be > 0")


# ----------------------------------------------------------------------------------------
# The computation, on grouped layouts: q [B,T,K,G,H], k, v [B,S,K,H], mask [B,S] bool.
# A carry is (s [B,K,F,H], z [B,K,F], m [B,K]): the sums S and zeta divided by exp(m).


def _key_weights(m, ck, mask):
    """Absorbing keys with scales ``ck [B,S,K]`` (``mask [B,S]``) into a carry of scale
    ``m [B,K]``: the new scale, each key's weight ``exp(ck - m_new)`` (0 if masked) and
    the factor ``exp(m - m_new)`` for the old sums."""
    ok = mask[:, :, None]
    m_new = jnp.maximum(m, jnp.max(jnp.where(ok, ck, MASK_VALUE), axis=1))
    w = jnp.where(ok, jnp.exp(ck - m_new[:, None, :]), 0.0)
    return m_new, w, jnp.exp(m - m_new)


def _read(fq, cq, s, z, m, eps, intra=None):
    """Outputs ``[B,T,K,G,H]`` for query features ``fq [B,T,K,G,F]`` (scales
    ``cq [B,T,K,G]``) from the sums ``s, z`` of scale ``m``, plus the chunk's own keys:
    ``intra = (A [B,K,G,T,S], v [B,S,K,H])``."""
    num = jnp.einsum("BTKGF,BKFH->BTKGH", fq, s)
    den = jnp.einsum("BTKGF,BKF->BTKG", fq, z)
    if intra is not None:
        a, v = intra
        num = num + jnp.einsum("BKGTS,BSKH->BTKGH", a, v)
        den = den + jnp.einsum("BKGTS->BTKG", a)
    # eps in the units of the stabilised sums: eps / (exp(c_q) exp(m)).
    log_eps = jnp.clip(math.log(eps) - cq - m[:, None, :, None], -EPS_LOG_CLIP, EPS_LOG_CLIP)
    return num / (den + jnp.exp(log_eps))[..., None]


def _chunk(features, eps, carry, xs):
    """One causal chunk (a ``lax.scan`` body): ``xs = (q [B,C,K,G,H], k, v [B,C,K,H],
    mask [B,C])``; returns the carry with the chunk absorbed and its outputs."""
    s, z, m = carry
    q, k, v, mask = xs
    fq, cq = features(q)
    fk, ck = features(k)
    m, w, alpha = _key_weights(m, ck, mask)
    s = s * alpha[:, :, None, None]
    z = z * alpha[:, :, None]
    fk = fk * w[..., None]
    C = q.shape[1]
    causal = jnp.tril(jnp.ones((C, C), bool))[None, None, None]
    a = jnp.where(causal, jnp.einsum("BTKGF,BSKF->BKGTS", fq, fk), 0.0)
    out = _read(fq, cq, s, z, m, eps, intra=(a, v))
    s = s + jnp.einsum("BSKF,BSKH->BKFH", fk, v)
    z = z + jnp.sum(fk, axis=1)
    return (s, z, m), out


def _causal_scan(carry, q, k, v, mask, features, chunk_size, eps):
    """Causal outputs ``[B,T,K,G,H]`` of ``q [B,T,K,G,H]`` over the carried sums plus
    ``k, v [B,T,K,H]`` (``mask [B,T]``), chunk by chunk, and the final carry."""
    T = q.shape[1]
    C = min(chunk_size, T)
    nc = -(-T // C)

    def chunks(x):  # [B,T,...] -> [nc,B,C,...], zero-padded (padded keys are masked)
        x = jnp.pad(x, ((0, 0), (0, nc * C - T)) + ((0, 0),) * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(x.shape[0], nc, C, *x.shape[2:]), 1, 0)

    # Rematerialised in the backward pass: only the per-chunk carries are saved (measured
    # at T=4096, H=F=64 on CPU: a third of the temp memory and 2x faster than saving
    # every chunk's intermediates).
    body = jax.checkpoint(functools.partial(_chunk, features, eps))
    carry, out = lax.scan(body, carry, tuple(chunks(x) for x in (q, k, v, mask)))
    out = jnp.moveaxis(out, 0, 1)
    return carry, out.reshape(out.shape[0], nc * C, *out.shape[3:])[:, :T]


def _prepare(q, k, v, kv_mask, kind, projection):
    """float32 grouped layouts, the bool mask and the stabilised feature function."""
    B, T, N, H = q.shape
    K = k.shape[2]
    qg = q.astype(jnp.float32).reshape(B, T, K, N // K, H)
    mask = jnp.ones(k.shape[:2], bool) if kv_mask is None else kv_mask != 0
    features = functools.partial(_stabilised, kind=kind, projection=projection)
    return qg, k.astype(jnp.float32), v.astype(jnp.float32), mask, features


def _num_features(kind, projection, H):
    return H if kind == "elu" else projection.shape[0]


def linear_attention(
    q,
    k,
    v,
    *,
    causal: bool,
    feature_map: str = "elu",
    projection=None,
    kv_mask=None,
    chunk_size: int = 64,
    eps: float = 1e-6,
):
    """Linear attention of ``q [B,T,N,H]`` over ``k, v [B,S,K,H]``; returns ``[B,T,N,H]``
    in q's dtype (see the module docstring).

    ``feature_map``: ``"elu"`` or ``"favor"`` (then ``projection [F, H]`` from
    :func:`favor_projection`). ``kv_mask [B,S]`` (bool or int, 0 = padding): masked keys
    are left out of every sum. ``causal`` (needs ``T == S``): query ``i`` sees keys
    ``j <= i``, computed in chunks of ``chunk_size`` (any ``T``). ``eps``: added to the
    denominator; a query that sees no key returns zeros.
    """
    _check(q, k, v, causal, feature_map, projection, kv_mask)
    _check_numbers(chunk_size, eps)
    B, T, N, H = q.shape
    qg, k, v, mask, features = _prepare(q, k, v, kv_mask, feature_map, projection)
    if causal:
        F = _num_features(feature_map, projection, H)
        carry = _zero_carry(B, k.shape[2], F, H)
        out = _causal_scan(carry, qg, k, v, mask, features, chunk_size, eps)[1]
    else:
        fk, ck = features(k)
        m, w, _ = _key_weights(jnp.full((B, k.shape[2]), MASK_VALUE), ck, mask)
        fk = fk * w[..., None]
        s = jnp.einsum("BSKF,BSKH->BKFH", fk, v)
        out = _read(*features(qg), s, jnp.sum(fk, axis=1), m, eps)
    return out.reshape(B, T, N, H).astype(q.dtype)


# ----------------------------------------------------------------------------------------
# Recurrent decoding.


def _zero_carry(B, K, F, H):
    return (
        jnp.zeros((B, K, F, H), jnp.float32),
        jnp.zeros((B, K, F), jnp.float32),
        jnp.full((B, K), MASK_VALUE, jnp.float32),
    )


def init_linear_state(batch, num_heads, num_features, head_dim, dtype=jnp.float32):
    """The empty decoding state, one per key/value head (``num_heads`` = K, shared by the
    G query heads of its group, as in GQA):

    ``{"s": [B,K,F,H], "z": [B,K,F]}`` in ``dtype`` (float32 recommended: the sums
    ``S / exp(m)`` and ``zeta / exp(m)``) and ``"m": [B,K]`` float32, the log scale of
    both (:data:`MASK_VALUE` until a key is seen). Its size never depends on how many
    tokens were absorbed.
    """
    s, z, m = _zero_carry(batch, num_heads, num_features, head_dim)
    return {"s": s.astype(dtype), "z": z.astype(dtype), "m": m}


def linear_attention_step(
    state,
    q,
    k,
    v,
    *,
    feature_map: str = "elu",
    projection=None,
    kv_mask=None,
    eps: float = 1e-6,
    chunk_size: int = 64,
):
    """Decode ``T >= 1`` new tokens: ``q [B,T,N,H]``, ``k, v [B,T,K,H]`` attend causally to
    the tokens in ``state`` (:func:`init_linear_state`) and to each other. Returns
    ``(out [B,T,N,H], new state)``; the state keeps its shapes and dtypes.

    ``kv_mask [B,T]`` (0 = padding): those tokens stay out of the state (left-padded
    prompts). Feeding a sequence in pieces equals :func:`linear_attention` with
    ``causal=True`` on the whole (a long prompt is processed in chunks of ``chunk_size``).
    """
    _check(q, k, v, True, feature_map, projection, kv_mask)
    _check_numbers(chunk_size, eps)
    B, T, N, H = q.shape
    K = k.shape[2]
    F = _num_features(feature_map, projection, H)
    want = {"s": (B, K, F, H), "z": (B, K, F), "m": (B, K)}
    got = {name: tuple(state[name].shape) for name in want}
    if got != want:
        raise ValueError(f"state shapes {got} do not match {want} for these inputs")
    qg, k, v, mask, features = _prepare(q, k, v, kv_mask, feature_map, projection)
    carry = tuple(state[name].astype(jnp.float32) for name in ("s", "z", "m"))
    (s, z, m), out = _causal_scan(carry, qg, k, v, mask, features, chunk_size, eps)
    new = {"s": s.astype(state["s"].dtype), "z": z.astype(state["z"].dtype), "m": m}
    return out.reshape(B, T, N, H).astype(q.dtype), new


# ----------------------------------------------------------------------------------------
# Reference.


def linear_attention_reference(
    q, k, v, *, causal, feature_map="elu", projection=None, kv_mask=None, eps=1e-6
):
    """The quadratic form, literally (for tests): ``A = phi(Q) phi(K)^T`` with the plain
    :func:`apply_feature_map`, masked entries set to 0, ``z = A V / (A 1 + eps)``. K/V heads are
    repeated to the N query heads. float32; returns q's dtype."""
    _check(q, k, v, causal, feature_map, projection, kv_mask)
    B, T, N, H = q.shape
    S, G = k.shape[1], N // k.shape[2]
    phi = functools.partial(apply_feature_map, feature_map=feature_map, projection=projection)
    fq = phi(q)
    fk = jnp.repeat(phi(k), G, axis=2)  # [B,S,N,F]
    vf = jnp.repeat(v.astype(jnp.float32), G, axis=2)
    a = jnp.einsum("BTNF,BSNF->BNTS", fq, fk)
    mask = jnp.ones((1, 1, T, S), bool)
    if causal:
        mask = mask & jnp.tril(jnp.ones((T, S), bool))[None, None]
    if kv_mask is not None:
        mask = mask & (kv_mask != 0)[:, None, None, :]
    a = jnp.where(mask, a, 0.0)
    out = jnp.einsum("BNTS,BSNH->BTNH", a, vf) / (jnp.einsum("BNTS->BTN", a) + eps)[..., None]
    return out.astype(q.dtype)


__all__ = [
    "FEATURE_MAPS",
    "favor_projection",
    "apply_feature_map",
    "init_linear_state",
    "linear_attention",
    "linear_attention_reference",
    "linear_attention_step",
]
