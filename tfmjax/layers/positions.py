"""Positional encodings: sinusoidal (Vaswani 2017), learned, RoPE (Su 2021), ALiBi (Press 2022),
T5 relative bias (Raffel 2020), FIRE (Li et al. 2023); randomized position sampling (Ruoss et al.
2023) and Abacus digit places (McLeish et al. 2024)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfmjax.kernels.masks import (
    alibi_bias,
    alibi_slopes,  # noqa: F401  (re-exported: one definition)
)
from tfmjax.layers.axes import EMBED, HEADS, dense_inits, named


def sinusoidal(positions, d_model: int, base: float = 10000.0, layout: str = "interleaved"):
    """``PE[pos, 2i] = sin(pos w_i)``, ``PE[pos, 2i+1] = cos(pos w_i)``, ``w_i = base^(-2i/D)``
    (Vaswani et al. 2017); ``layout="half_split"``: all sines, then all cosines (Marian).

    ``positions [..., T]`` (int) -> ``[..., T, D]`` float32.
    """
    i = jnp.arange(d_model // 2, dtype=jnp.float32)
    omega = base ** (-2.0 * i / d_model)
    angles = positions[..., None].astype(jnp.float32) * omega.reshape((1,) * positions.ndim + (-1,))
    if layout == "half_split":
        pe = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    elif layout == "interleaved":
        pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., T, D/2, 2]
        pe = pe.reshape(*angles.shape[:-1], 2 * (d_model // 2))
    else:
        raise ValueError(f"sinusoidal layout={layout!r} is not one of interleaved, half_split")
    if d_model % 2:
        pe = jnp.concatenate([pe, jnp.zeros((*pe.shape[:-1], 1), pe.dtype)], axis=-1)
    return pe


class LearnedPositions(nn.Module):
    """``W_pos[positions]`` from a ``[max_len, D]`` table (GPT-2, BERT)."""

    max_len: int
    d_model: int

    @nn.compact
    def __call__(self, positions):
        init = named(nn.initializers.normal(0.02), None, EMBED)
        table = self.param("pos_embedding", init, (self.max_len, self.d_model))
        return jnp.take(table, positions, axis=0)


def apply_rope(x, positions, base: float = 10000.0, layout: str = "interleaved"):
    """Rotate feature pairs of ``x`` by ``pos * base^(-2i/H)`` (RoPE, Su et al. 2021).

    ``layout="interleaved"``: pair ``i`` is ``(x[2i], x[2i+1])``; ``"half_split"``: pair ``i`` is
    ``(x[i], x[i + H/2])`` (``rotate_half``, the Hugging Face layout).
    ``x [B,T,N,H]``, ``positions [B,T]`` -> ``[B,T,N,H]`` in x's dtype.
    """
    H = x.shape[-1]
    theta = base ** (-2.0 * jnp.arange(H // 2, dtype=jnp.float32) / H)  # [H/2]
    angles = (
        positions.astype(jnp.float32)[:, :, None, None] * theta[None, None, None]
    )  # [B,T,1,H/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xf = x.astype(jnp.float32)
    if layout == "half_split":
        x0, x1 = xf[..., : H // 2], xf[..., H // 2 :]
        return jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).astype(x.dtype)
    if layout != "interleaved":
        raise ValueError(f"rope layout={layout!r} is not one of interleaved, half_split")
    pairs = xf.reshape(*x.shape[:-1], H // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return rotated.reshape(x.shape).astype(x.dtype)


def relative_bucket(relative_position, *, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucketing of ``key_pos - query_pos``: exact for small offsets, log-spaced after."""
    n = -relative_position
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / np.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """T5-style learned scalar bias per head and bucket: returns ``[1, N, T, S]``."""

    num_heads: int
    num_buckets: int  # T5: 32
    max_distance: int  # T5: 128
    bidirectional: bool  # True in an encoder, False in a decoder

    @nn.compact
    def __call__(self, q_pos, kv_pos):
        """``q_pos [T]``, ``kv_pos [S]`` (absolute positions) -> ``[1,N,T,S]``; per row
        ``q_pos [B,T]``, ``kv_pos [B,S]`` -> ``[B,N,T,S]``."""
        init = named(nn.initializers.normal(0.02), None, HEADS)
        table = self.param("rel_bias", init, (self.num_buckets, self.num_heads))
        buckets = relative_bucket(
            kv_pos[..., None, :] - q_pos[..., :, None],
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        bias = jnp.moveaxis(table[buckets], -1, -3)  # [..., N, T, S]
        return bias if bias.ndim == 4 else bias[None]


def alibi_row_bias(slopes, q_pos, kv_pos):
    """ALiBi ``-m_n |p - s|`` from per-row positions ``q_pos [B,T]``, ``kv_pos [B,S]``:
    ``[B,N,T,S]`` (the dense form randomized positions need; slot distances otherwise)."""
    return jax.vmap(alibi_bias, in_axes=(None, 0, 0))(slopes, q_pos, kv_pos)


def randomized_positions(key, index, lengths, max_position: int):
    """Ruoss et al. (2023): each row's tokens take a sorted uniform random subset of
    ``[0, max_position)`` in place of ``0..n-1``.

    ``index [B,T]``: each token's place in its segment (0-based); ``lengths [B]``: the row's
    ``n`` (its longest segment; a packed row's shorter segments take the first places of the
    same subset). Returns ``[B,T]`` int32, ``positions[b, t] = sorted_subset_b[index[b, t]]``.
    The first ``n`` entries of a uniform random permutation are a uniform ``n``-subset.
    """
    B, T = index.shape
    order = jnp.argsort(jax.random.uniform(key, (B, max_position)), axis=1)[:, :T]
    order = jnp.where(jnp.arange(T)[None, :] < lengths[:, None], order, max_position)
    subset = jnp.sort(order, axis=1)  # the row's n positions first, then the sentinel
    picked = jnp.take_along_axis(subset, jnp.clip(index, 0, T - 1), axis=1)
    return jnp.where(picked < max_position, picked, 0).astype(jnp.int32)


def windowed_places(key, longest, spread: int, rows: int):
    """Randomized Abacus places: a row's places ``1..K`` (``K = longest[b]``, its longest
    number) take a sorted uniform random ``K``-subset of a window of ``spread * K`` place
    rows (at most ``rows - 1``) whose start is uniform over the rows ``1..rows-1``. With
    ``spread = 1`` the window is the contiguous run at a random offset of McLeish et al.
    (2024); wider, places up to ``spread * K - 1`` apart meet while training, and gaps of 1
    (the places evaluation reads) stay common (Ruoss et al. 2023 draw from the whole range).

    ``longest [B]`` -> the place map ``[B, rows]`` int32: ``map[b, p]`` is place ``p``'s row
    (``map[:, 0] = 0``, not a digit; entries past ``K`` are 0, never read)."""
    B = longest.shape[0]
    width = jnp.minimum(spread * longest, rows - 1)  # [B]
    start_key, pick_key = jax.random.split(key)
    start = jnp.floor(jax.random.uniform(start_key, (B,)) * (rows - width)).astype(jnp.int32)
    col = jnp.arange(rows - 1)[None, :]
    scores = jnp.where(col < width[:, None], jax.random.uniform(pick_key, (B, rows - 1)), 2.0)
    picked = jnp.where(col < longest[:, None], jnp.argsort(scores, axis=1), rows)
    subset = jnp.sort(picked, axis=1)  # the K picks of the window, then the sentinel
    places = jnp.where(subset < rows, subset + start[:, None] + 1, 0).astype(jnp.int32)
    return jnp.concatenate([jnp.zeros((B, 1), jnp.int32), places], axis=1)


EVALUATION_POSITION_SEED = 0  # fixes the one draw that evaluation and decoding read


def evaluation_position_table(width: int, max_position: int) -> np.ndarray:
    """Randomized positions at evaluation: Ruoss et al. (2023) draw positions at test time
    too, and a model trained on sorted random subsets fails on the atypical ``0..T-1``
    (every gap 1, where training gaps average ``max_position / n``). One sorted uniform
    random ``width``-subset of ``[0, max_position)`` for a sequence ``width`` slots wide,
    fixed by :data:`EVALUATION_POSITION_SEED` and shared by the batch's rows: ordered
    position ``p`` becomes ``table[p]``. The width is the input's (uncached) or the KV
    cache's (decoding), so decoding reads what the uncached forward over the whole sequence
    reads. ``[width]`` int32, strictly increasing."""
    rng = np.random.default_rng(EVALUATION_POSITION_SEED)
    return np.sort(rng.permutation(max_position)[:width]).astype(np.int32)


def digit_runs(ids, first_digit: int, carry=None, from_end: bool = False):
    """Abacus places (McLeish et al. 2024): each digit's 1-based place within its run of
    consecutive digits (a number), 0 on every other token. ``ids [B,T]`` -> ``[B,T]`` int32.

    ``carry [B]``: the place of the token before ``ids[:, 0]`` (decoding one token at a time);
    a run that starts the chunk continues it. ``from_end``: count each run from its last
    digit instead (a whole input only: its place value when written most significant first).
    """
    if from_end:
        if carry is not None:
            raise ValueError("digit places counted from a run's end need the whole input")
        return digit_runs(ids[:, ::-1], first_digit)[:, ::-1]
    T = ids.shape[1]
    is_digit = (ids >= first_digit) & (ids < first_digit + 10)
    idx = jnp.arange(T)[None, :]
    last_other = jax.lax.cummax(jnp.where(is_digit, -1, idx), axis=1)  # -1: none yet
    carried = 0 if carry is None else jnp.where(last_other < 0, carry[:, None], 0)
    return jnp.where(is_digit, idx - last_other + carried, 0).astype(jnp.int32)


class FireBias(nn.Module):
    """FIRE (Li et al. 2023): ``b(i, j) = f(psi(i - j) / psi(max(L, i)))`` with
    ``psi(x) = log(c x + 1)``, ``f`` an MLP ``1 -> hidden -> N`` (one bias per head), ``c``
    and the threshold ``L`` learned (kept positive by a softplus; initial ``c = 0.1``,
    ``L = init_threshold``). Bidirectional: ``|i - j|`` and a second MLP input ``[j > i]``.

    ``q_pos [B,T]``, ``kv_pos [B,S]`` (absolute positions) -> ``[B,N,T,S]`` float32.
    """

    num_heads: int
    hidden: int
    init_threshold: float
    bidirectional: bool

    @nn.compact
    def __call__(self, q_pos, kv_pos):
        softplus_inv = lambda y: float(np.log(np.expm1(y)))  # noqa: E731
        c = jax.nn.softplus(self.param("c", nn.initializers.constant(softplus_inv(0.1)), ()))
        init_l = nn.initializers.constant(softplus_inv(self.init_threshold))
        threshold = jax.nn.softplus(self.param("threshold", init_l, ()))
        i = q_pos.astype(jnp.float32)[:, :, None]  # [B,T,1]
        distance = i - kv_pos.astype(jnp.float32)[:, None, :]  # [B,T,S]
        psi = lambda x: jnp.log(c * x + 1.0)  # noqa: E731
        features = [psi(jnp.abs(distance)) / psi(jnp.maximum(threshold, i))]
        if self.bidirectional:
            features.append((distance < 0).astype(jnp.float32))
        x = jnp.stack(features, axis=-1)  # [B,T,S,1|2]
        h = nn.relu(nn.Dense(self.hidden, name="fire_in")(x))
        out = nn.Dense(self.num_heads, name="fire_out", **dense_inits((None, HEADS), (HEADS,)))
        return jnp.moveaxis(out(h), -1, 1)  # [B,N,T,S]
