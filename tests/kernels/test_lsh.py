"""LSH attention (Reformer): the sorted-chunk fast path against its materialised reference in
values and gradients; with one bucket and one chunk, full (causal) softmax attention over shared
QK with the self-masking rule (:mod:`tfmjax.kernels.reference`); the cached decode against the
unchunked reference; the hash itself. Tolerances: float32 paths against each other 2e-5
(values) and 1e-4 (gradients); the reference path against the fast one runs the same float32
math in another order."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.kernels import lsh, reference

B, T, N, H = 2, 13, 4, 8


def inputs(K=2, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(B, T, K, H)), jnp.float32)
    mask = jnp.asarray(np.arange(T)[None] < np.array([[T], [T - 3]]))  # row 1: 3 padding
    segments = jnp.asarray(np.where(np.arange(T) < 6, 1, 2)[None].repeat(B, 0), jnp.int32)
    return q, v, mask, segments


CASES = [  # buckets, rounds, chunk, causal
    (4, 2, 4, True),
    (8, 3, 5, False),
    (2, 2, 3, True),
]


@pytest.mark.parametrize("buckets,rounds,chunk,causal", CASES)
def test_sorted_chunks_equal_the_materialised_mask(buckets, rounds, chunk, causal):
    """Values and gradients (wrt queries and values), with padding and two packed segments;
    ``T = 13`` is no multiple of the chunk (the fast path pads it)."""
    q, v, mask, segments = inputs()
    rot = lsh.draw_rotations(1, N, rounds, H, buckets)
    kw = dict(chunk=chunk, causal=causal, mask=mask, segment_ids=segments)
    fast = jax.jit(functools.partial(lsh.lsh_attention, rotations=rot, **kw))
    slow = jax.jit(functools.partial(lsh.lsh_reference, rotations=rot, **kw))
    np.testing.assert_allclose(fast(q, v), slow(q, v), rtol=2e-5, atol=2e-5)
    cot = jax.random.normal(jax.random.key(3), q.shape)
    loss = lambda f: lambda q, v: jnp.sum(f(q, v) * cot)  # noqa: E731
    g_fast = jax.jit(jax.grad(loss(fast), argnums=(0, 1)))(q, v)
    g_slow = jax.jit(jax.grad(loss(slow), argnums=(0, 1)))(q, v)
    for a, b in zip(g_fast, g_slow, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _full_shared_qk(q, v, causal):
    """Softmax attention over keys ``q/|q|`` with the diagonal at -1e5 (added, which the
    softmax cannot tell from replaced: exp(-1e5) is 0 in float32), GQA values repeated."""
    G = q.shape[2] // v.shape[2]
    diag = jnp.where(jnp.eye(T, dtype=bool), lsh.SELF_LOGIT, 0.0)[None, None]
    return reference.attention(
        q,
        lsh.unit_keys(q),
        jnp.repeat(v, G, axis=2),
        causal=causal,
        q_segment_ids=None,
        kv_segment_ids=None,
        window=None,
        alibi_slopes=None,
        bias=diag,
        q_offset=0,
        scale=H**-0.5,
    )


@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_one_bucket_one_chunk_is_full_shared_qk_attention(causal, rounds):
    """The oracle: every token in one bucket and one chunk sees every (earlier) token, so LSH
    attention is softmax attention over shared QK; with several rounds the duplicate
    correction (``log N_ij``) makes the rounds' mix the same softmax. Token 0 of a causal row
    has only itself and attends to itself."""
    q, v, _, _ = inputs()
    rot = lsh.draw_rotations(0, N, rounds, H, 1)
    got = lsh.lsh_attention(q, v, rot, chunk=T, causal=causal)
    want = _full_shared_qk(q, v, causal)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if causal:
        np.testing.assert_allclose(got[:, 0], jnp.repeat(v, 2, axis=2)[:, 0], atol=1e-6)


def test_a_token_attends_to_itself_only_when_nothing_else_is_there():
    """Bidirectional, one bucket: the output never leans on the own value (replacing a
    token's own value changes its output by exp(-1e5)-small amounts only)."""
    q, v, _, _ = inputs()
    rot = lsh.draw_rotations(0, N, 1, H, 1)
    out = lsh.lsh_attention(q, v, rot, chunk=T, causal=False)
    v2 = v.at[:, 5].set(100.0)
    out2 = lsh.lsh_attention(q, v2, rot, chunk=T, causal=False)
    np.testing.assert_allclose(out2[:, 5], out[:, 5], atol=1e-5)


def test_buckets_are_angular_hashes():
    """``argmax([xR; -xR])``: a positive rescaling keeps every bucket, the negated query
    lands in the opposite bucket (``b ± n/2``)."""
    q, *_ = inputs()
    rot = lsh.draw_rotations(0, N, 2, H, 8)
    b = lsh.hash_buckets(q, rot)
    assert b.shape == (B, N, 2, T) and int(b.min()) >= 0 and int(b.max()) < 8
    np.testing.assert_array_equal(lsh.hash_buckets(3.0 * q, rot), b)
    np.testing.assert_array_equal(lsh.hash_buckets(-q, rot), (b + 4) % 8)


def test_cached_decode_is_the_unchunked_reference():
    """Every query against the whole (filled) cache of unit keys, values and buckets equals
    :func:`lsh_reference` with ``chunk=None`` (each key sharing a bucket in some round)."""
    q, v, mask, _ = inputs()
    rot = lsh.draw_rotations(2, N, 2, H, 4)
    buckets = lsh.real_buckets(q, rot, mask)  # padding in its own bucket, as the reference
    got = lsh.lsh_decode(
        q,
        jnp.swapaxes(lsh.unit_keys(q), 1, 2),
        jnp.swapaxes(v, 1, 2),
        buckets,
        buckets,
        q_positions=jnp.broadcast_to(jnp.arange(T), (B, T)),
        kv_segment_ids=mask.astype(jnp.int32),
        scale=None,
    )
    want = lsh.lsh_reference(q, v, rot, chunk=None, causal=True, mask=mask)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
