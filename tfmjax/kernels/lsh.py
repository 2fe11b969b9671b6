"""LSH attention (Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer").

Shared query-key: the keys are the unit-normalised queries, ``k̂_j = q_j/|q_j|``, and the
logit of query ``i`` at key ``j`` is ``q_i·k̂_j·scale``. Each of ``R`` hash rounds draws a
random rotation ``rot [H, n_buckets/2]`` per head and puts token ``j`` in bucket
``argmax([q_j rot; -q_j rot])`` (angular LSH; ``n_buckets = 1``: one bucket). The set of keys
query ``i`` sees in round ``r`` is

    P_i^r = {j : same bucket in round r, and, sorting the row by (bucket, position) and
             cutting it into chunks of ``chunk`` tokens, j's chunk is i's or the one before}

(no wrap-around: the first chunk sees itself only; padding, ``mask`` false, hashes into a
bucket of its own sorted last, so it shifts no real token's chunk), intersected with
``causal`` (``j <= i``), the key mask (``mask``: padding) and equal segment ids (packed
rows). A token sees itself only when it has nothing else: its own logit is replaced by
``SELF_LOGIT`` = -1e5 (the paper's rule); a padding query, which has no real key, sees
itself alone. Rounds are combined by their logsumexp weights, each key's logit lowered by
``log N_ij`` (``N_ij``: the rounds whose ``P_i^r`` hold ``j``; the paper's eq. 4-5), so the
combined output is exactly softmax attention over the union ``P_i = ∪_r P_i^r``:

* :func:`lsh_attention`: the fast path. Per round, gather the sorted row, each chunk of
  ``chunk`` queries against its own and the previous chunk's keys (``[C, m, 2m]`` scores
  instead of ``[T, T]``), scatter back, combine the rounds. ``O(T·chunk)`` memory.
* :func:`lsh_reference`: the plain twin: the union mask ``[T, S]`` materialised from the
  same buckets and sort ranks, one masked softmax over full shared-QK scores. ``chunk=None``:
  no chunk restriction (every same-bucket key in some round): the unchunked LSH attention the
  chunks approximate, which is what cached decoding computes (:func:`lsh_decode`).

Packed rows are separated (segment ids) but share one sort: a segment's tokens can change
another's chunks. Causal models: the chunk a token falls in depends on how many *later*
tokens hash to lower buckets, so with ``chunk < T`` which past keys a query sees (never
their values) depends on the future, as in the paper. With ``chunk >= T`` it does not, and
the cached decode equals the training forward (tests/models/test_lsh.py).

Shapes: ``q [B,T,N,H]`` (the shared query-keys), ``v [B,T,K,H]`` (``K`` divides ``N``: each
value head serves ``N/K`` query heads), ``rotations [N,R,H,n_buckets/2]``, ``mask`` and
``segment_ids [B,T]``. Computed in float32, returned in ``q``'s dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SELF_LOGIT = -1e5  # a token's logit at itself: attended only when nothing else is
BLOCKED = -1e9  # a key outside P_i (finite: a row with nothing but padding stays finite)


def draw_rotations(seed: int, num_heads: int, rounds: int, head_dim: int, n_buckets: int):
    """The fixed random rotations ``[N,R,H,n_buckets/2]`` of ``seed`` (float32; ``n_buckets
    = 1``: a ``[N,R,H,0]`` placeholder, every token in bucket 0)."""
    shape = (num_heads, rounds, head_dim, n_buckets // 2)
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def hash_buckets(q, rotations):
    """Bucket of each token per head and round ``[B,N,R,T]`` int32 (``argmax([xR; -xR])``)."""
    B, T, N, _ = q.shape
    R = rotations.shape[1]
    if rotations.shape[-1] == 0:
        return jnp.zeros((B, N, R, T), jnp.int32)
    rotated = jnp.einsum("BTNH,NRHb->BNRTb", q.astype(jnp.float32), rotations)
    return jnp.argmax(jnp.concatenate([rotated, -rotated], -1), -1).astype(jnp.int32)


def bucket_count(rotations) -> int:
    """``n_buckets`` of ``rotations [N,R,H,n_buckets/2]`` (1 for the empty placeholder)."""
    return 2 * rotations.shape[-1] if rotations.shape[-1] else 1


def real_buckets(q, rotations, keep):
    """:func:`hash_buckets`, padding (``keep [B,T]`` false) in bucket ``n_buckets``, of its
    own and sorted last: padding then changes no real token's rank, so no real output."""
    buckets = hash_buckets(q, rotations)
    return jnp.where(keep[:, None, None, :], buckets, bucket_count(rotations))


def sort_order(buckets):
    """Per round, the row sorted by (bucket, position): ``order [B,N,R,T]`` (positions in
    sorted order) and ``rank [B,N,R,T]`` (each position's place in it)."""
    T = buckets.shape[-1]
    position = jnp.arange(T).reshape((1,) * (buckets.ndim - 1) + (T,))
    order = jnp.argsort(buckets * T + position, axis=-1).astype(jnp.int32)
    rank = jnp.argsort(order, axis=-1).astype(jnp.int32)
    return order, rank


def unit_keys(q):
    """The shared keys ``q/|q|`` (float32; a zero query stays zero)."""
    q = q.astype(jnp.float32)
    return q * jax.lax.rsqrt(jnp.maximum(jnp.sum(q * q, -1, keepdims=True), 1e-12))


def _allowed(pos_q, pos_k, seg_q, seg_k, keep_k, causal):
    """Pairs any round may show: causal, same segment, real key (broadcasting)."""
    ok = (seg_q == seg_k) & keep_k
    return ok & (pos_k <= pos_q) if causal else ok


def _defaults(q, mask, segment_ids):
    B, T = q.shape[:2]
    keep = jnp.ones((B, T), bool) if mask is None else mask.astype(bool)
    seg = jnp.zeros((B, T), jnp.int32) if segment_ids is None else segment_ids
    return keep, seg


def _members(bucket_q, bucket_k, chunk_q, chunk_k):
    """Whether key ``k`` is in ``P_q^r`` for each round (last axis ``R``); ``chunk_*`` None:
    no chunk restriction."""
    same = bucket_q == bucket_k
    if chunk_q is None:
        return same
    return same & ((chunk_k == chunk_q) | (chunk_k == chunk_q - 1))


def lsh_reference(
    q, v, rotations, *, chunk, causal, mask=None, segment_ids=None, scale=None, buckets=None
):
    """The materialised twin of :func:`lsh_attention` (module docstring); ``chunk=None``:
    every same-bucket key in some round (unchunked). ``buckets [B,N,R,T]``: given instead of
    hashed (tests)."""
    B, T, N, H = q.shape
    G = N // v.shape[2]
    scale = H**-0.5 if scale is None else scale
    keep, seg = _defaults(q, mask, segment_ids)
    buckets = real_buckets(q, rotations, keep) if buckets is None else buckets
    b = jnp.moveaxis(buckets, 2, -1)  # [B,N,T,R]
    c = None if chunk is None else jnp.moveaxis(sort_order(buckets)[1] // chunk, 2, -1)
    member = _members(
        b[:, :, :, None],
        b[:, :, None, :],
        None if c is None else c[:, :, :, None],
        None if c is None else c[:, :, None, :],
    ).any(-1)  # [B,N,T,S]
    pos = jnp.arange(T)[None, None]  # [1,1,T]
    allowed = _allowed(
        pos[..., None], pos[..., None, :], seg[:, None, :, None], seg[:, None, None, :],
        keep[:, None, None, :], causal,
    )  # fmt: skip
    logits = jnp.einsum("BTNH,BSNH->BNTS", q.astype(jnp.float32), unit_keys(q)) * scale
    self_pair = pos[..., None] == pos[..., None, :]
    logits = jnp.where(self_pair, SELF_LOGIT, logits)
    logits = jnp.where((member & allowed) | self_pair, logits, BLOCKED)
    probs = jax.nn.softmax(logits, axis=-1)
    vv = jnp.repeat(v.astype(jnp.float32), G, axis=2)
    return jnp.einsum("BNTS,BSNH->BTNH", probs, vv).astype(q.dtype)


def _chunks(x, C: int, m: int):
    """``[..., C*m, *rest]`` -> ``(this [..., C, m, *rest], window [..., C, 2m, *rest])``:
    each chunk and its keys (the previous chunk, then itself; chunk 0's previous is a copy
    of itself, masked by the caller)."""
    this = x.reshape(*x.shape[:3], C, m, *x.shape[4:])
    prev = jnp.concatenate([this[:, :, :, :1], this[:, :, :, :-1]], axis=3)
    return this, jnp.concatenate([prev, this], axis=4)


def lsh_attention(q, v, rotations, *, chunk, causal, mask=None, segment_ids=None, scale=None):
    """LSH attention ``[B,T,N,H]`` by sorted chunks (module docstring). ``T`` need not be a
    multiple of ``chunk``: the row is padded with masked tokens in a bucket of their own,
    sorted last, which changes no real token's rank."""
    B, T, N, H = q.shape
    G = N // v.shape[2]
    scale = H**-0.5 if scale is None else scale
    keep, seg = _defaults(q, mask, segment_ids)
    m = min(chunk, T)
    C = -(-T // m)
    P = C * m - T  # padding to whole chunks
    buckets = real_buckets(q, rotations, keep)  # [B,N,R,T]
    R = buckets.shape[2]

    def pad(a, value):
        return jnp.pad(a, [(0, 0), (0, P)] + [(0, 0)] * (a.ndim - 2), constant_values=value)

    qf, vf = pad(q.astype(jnp.float32), 0.0), pad(jnp.repeat(v.astype(jnp.float32), G, 2), 0.0)
    keep, seg = pad(keep, False), pad(seg, -1)
    buckets = jnp.pad(buckets, [(0, 0)] * 3 + [(0, P)], constant_values=bucket_count(rotations))
    order, rank = sort_order(buckets)  # [B,N,R,Tp]
    chunk_of = rank // m  # [B,N,R,Tp]
    # Per sorted token: its position, its bucket and chunk in every round (for N_ij).
    sig = jnp.concatenate([jnp.moveaxis(buckets, 2, -1), jnp.moveaxis(chunk_of, 2, -1)], -1)
    gather = lambda a: jnp.take_along_axis(a[:, :, None], order[..., None], axis=3)  # noqa: E731
    heads = lambda a: jnp.broadcast_to(jnp.moveaxis(a, 1, 2), (B, N, C * m, a.shape[-1]))  # noqa: E731
    sq = gather(heads(qf))  # [B,N,R,Tp,H]
    sv = gather(heads(vf))
    ssig = gather(sig)  # [B,N,R,Tp,2R]
    spos = order
    skeep = jnp.take_along_axis(jnp.broadcast_to(keep[:, None, None], order.shape), order, -1)
    sseg = jnp.take_along_axis(jnp.broadcast_to(seg[:, None, None], order.shape), order, -1)
    q_c, _ = _chunks(sq, C, m)  # [B,N,R,C,m,H]
    _, k_w = _chunks(unit_keys(sq), C, m)  # [B,N,R,C,2m,H]
    _, v_w = _chunks(sv, C, m)
    sbucket = jnp.take_along_axis(buckets, order, -1)  # this round's bucket, sorted
    (pq, pk), (sgq, sgk), (_, kk), (bq_r, bk_r) = (
        _chunks(a, C, m) for a in (spos, sseg, skeep, sbucket)
    )
    sig_q, sig_k = _chunks(ssig, C, m)  # [B,N,R,C,m|2m,2R]
    first = jnp.arange(2 * m) < m  # the window's previous-chunk half
    real_prev = (jnp.arange(C) > 0)[:, None] | ~first[None, :]  # [C,2m]: chunk 0 has none
    real_prev = real_prev[None, None, None, :, None, :]
    bq, bk = sig_q[..., :R][..., :, None, :], sig_k[..., :R][..., None, :, :]
    cq, ck = sig_q[..., R:][..., :, None, :], sig_k[..., R:][..., None, :, :]
    counts = _members(bq, bk, cq, ck).sum(-1)  # [B,N,R,C,m,2m]: N_ij
    allowed = _allowed(
        pq[..., :, None], pk[..., None, :], sgq[..., :, None], sgk[..., None, :],
        kk[..., None, :], causal,
    )  # fmt: skip
    same = bq_r[..., :, None] == bk_r[..., None, :]  # j in P_i^r (the window is r's chunks)
    self_pair = (pq[..., :, None] == pk[..., None, :]) & real_prev  # chunk 0's copy is not
    allowed = (allowed & real_prev & same) | self_pair
    logits = jnp.einsum("BNRCmH,BNRCkH->BNRCmk", q_c, k_w) * scale
    logits = jnp.where(self_pair, SELF_LOGIT, logits)
    logits = jnp.where(allowed, logits - jnp.log(jnp.maximum(counts, 1)), BLOCKED)
    lse = jax.nn.logsumexp(logits, axis=-1)  # [B,N,R,C,m]
    out = jnp.einsum("BNRCmk,BNRCkH->BNRCmH", jnp.exp(logits - lse[..., None]), v_w)
    # Back to positions, then the rounds weighted by exp(lse_r - logsumexp_r lse_r).
    out = jnp.take_along_axis(out.reshape(B, N, R, C * m, H), rank[..., None], axis=3)
    lse = jnp.take_along_axis(lse.reshape(B, N, R, C * m), rank, axis=3)
    weights = jax.nn.softmax(lse, axis=2)[..., None]  # [B,N,R,Tp,1]
    out = jnp.sum(out * weights, axis=2)[:, :, :T]  # [B,N,T,H]
    return jnp.moveaxis(out, 1, 2).astype(q.dtype)


def lsh_decode(q, k_cache, v_cache, buckets_q, buckets_k, *, q_positions, kv_segment_ids, scale):
    """Cached LSH attention, unchunked: queries ``q [B,T,N,H]`` at slots ``q_positions
    [B,T]`` against cached unit keys ``k_cache [B,N,S,H]``, values ``v_cache [B,K,S,H]`` and
    buckets ``buckets_q [B,N,R,T]``, ``buckets_k [B,N,R,S]``: each query sees the earlier and
    its own slots (real: ``kv_segment_ids [B,S]`` not 0) sharing its bucket in some round,
    itself only when nothing else (:func:`lsh_reference` with ``chunk=None``)."""
    H = q.shape[-1]
    G = q.shape[2] // v_cache.shape[1]
    scale = H**-0.5 if scale is None else scale
    S = k_cache.shape[2]
    member = (buckets_q[..., :, None] == buckets_k[..., None, :]).any(2)  # [B,N,T,S]
    slots = jnp.arange(S)
    qp = q_positions[:, None, :, None]
    allowed = (slots[None, None, None, :] <= qp) & (kv_segment_ids != 0)[:, None, None, :]
    logits = jnp.einsum("BTNH,BNSH->BNTS", q.astype(jnp.float32), k_cache) * scale
    self_pair = slots[None, None, None, :] == qp
    logits = jnp.where(self_pair, SELF_LOGIT, logits)
    logits = jnp.where((member & allowed) | self_pair, logits, BLOCKED)
    probs = jax.nn.softmax(logits, axis=-1)
    vv = jnp.repeat(v_cache.astype(jnp.float32), G, axis=1)
    return jnp.einsum("BNTS,BNSH->BTNH", probs, vv).astype(q.dtype)
