"""An independent NumPy oracle for attention and positional encodings, written from the
formulas alone: nothing here imports ``tfmjax.kernels`` or ``tfmjax.layers``, so a rule
changed in the library (e.g. in ``masks.allowed``, which every attention path shares) shows
up as a disagreement instead of being copied into the expected values.

Conventions (those of ``tfmjax.kernels.attention``):

* ``q [B,T,N,H]``, ``k, v [B,S,K,H]``; query head ``n`` uses key/value head ``n // (N/K)``.
* Query ``t`` sits at absolute position ``p = q_offset + t``, key ``s`` at position ``s``.
* A key is visible when every rule that is switched on holds: causal ``s <= p``; segment
  ids: ``q_seg[t] == kv_seg[s] != 0`` (0 = padding); and the sparse pattern, where ``d = p -
  s``: window ``w`` alone: ``|d| <= w``; stride ``r`` (Child et al. 2019): ``|d| < r`` (or
  ``|d| <= w`` with a window) or ``d`` a multiple of ``r`` (negative ``d`` too); global
  tokens ``g`` (Beltagy et al. 2020): a query ``p < g`` or key ``s < g`` passes the pattern
  whatever it says (not the causal or segment rules); BigBird's random blocks (Zaheer et al.
  2020; ``random_blocks`` with fields count, size, seed, num_blocks): key block ``s // size`` among
  the ``count`` draws of query block ``p // size`` passes too (:func:`oracle_random_block`:
  the hash written out in Python integers).
* Scores ``scale * <q, k>`` (``scale`` defaults to ``1/sqrt(H)``), plus ALiBi
  ``-slope_n * |p - s|``, plus a dense ``bias [B|1, N|1, T, S]``; softmax over the visible
  keys; a query that sees no key returns zeros.

Everything is computed in float64 with explicit loops over rows, so the oracle is slow but
obviously right; keep its inputs tiny.
"""

from __future__ import annotations

import math

import numpy as np


def _lowbias32(x: int) -> int:
    """The 32-bit xor-shift-multiply hash ("lowbias32"), in Python integers."""
    x &= 0xFFFFFFFF
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x ^= x >> shift
        x = (x * factor) & 0xFFFFFFFF
    return x ^ (x >> 16)


def oracle_random_block(random_blocks, q_block: int, draw: int, causal: bool) -> int | None:
    """Key block of draw ``draw`` for query block ``q_block``: a hash of (seed, block, draw),
    reduced to the blocks before ``q_block`` (causal) or to the other ``num_blocks - 1``."""
    seed, num_blocks = random_blocks.seed, random_blocks.num_blocks
    x = _lowbias32(q_block * 0x9E3779B1 + (seed * 7919 + draw) % (1 << 31))
    x = _lowbias32(x ^ (draw * 0x27D4EB2F % (1 << 31))) & 0x7FFFFFFF
    if causal:
        return x % q_block if q_block >= 1 else None
    if num_blocks < 2:
        return None
    target = x % (num_blocks - 1)
    return target + (target >= q_block)


def oracle_visible(
    p: int,
    s: int,
    *,
    causal,
    window,
    stride=None,
    global_tokens=0,
    random_blocks=None,
    q_seg=None,
    kv_seg=None,
) -> bool:
    """Whether the query at absolute position ``p`` (segment ``q_seg``) sees key ``s``."""
    if causal and s > p:
        return False
    if q_seg is not None and (q_seg == 0 or q_seg != kv_seg):
        return False
    if p < global_tokens or s < global_tokens:
        return True  # a global token: the window/stride pattern does not apply
    if random_blocks is not None and (window is not None or stride is not None):
        count, size = random_blocks.count, random_blocks.size
        draws = {oracle_random_block(random_blocks, p // size, i, causal) for i in range(count)}
        if s // size in draws:
            return True  # a random block: the window/stride pattern does not apply
    distance = p - s
    if stride is not None:
        if window is None:
            local = -stride < distance < stride
        else:
            local = -window <= distance <= window
        return local or distance % stride == 0  # Python's % is a floor modulo
    if window is not None and abs(distance) > window:
        return False
    return True


def oracle_attention(
    q,
    k,
    v,
    *,
    causal=False,
    q_segment_ids=None,
    kv_segment_ids=None,
    window=None,
    stride=None,
    global_tokens=0,
    random_blocks=None,
    alibi_slopes=None,
    bias=None,
    q_offset=0,
    scale=None,
):
    """``q [B,T,N,H]``, ``k, v [B,S,K,H]`` -> ``[B,T,N,H]`` float64 (see the module docstring)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    assert N % K == 0, (N, K)
    group = N // K
    if scale is None:
        scale = 1.0 / math.sqrt(H)
    q_seg = None if q_segment_ids is None else np.asarray(q_segment_ids)
    kv_seg = None if kv_segment_ids is None else np.asarray(kv_segment_ids)
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
    dense = None if bias is None else np.asarray(bias, np.float64)
    out = np.zeros((B, T, N, H), np.float64)
    for b in range(B):
        for n in range(N):
            kv_head = n // group
            for t in range(T):
                p = q_offset + t
                keys, scores = [], []
                for s in range(S):
                    if not oracle_visible(
                        p,
                        s,
                        causal=causal,
                        window=window,
                        stride=stride,
                        global_tokens=global_tokens,
                        random_blocks=random_blocks,
                        q_seg=None if q_seg is None else q_seg[b, t],
                        kv_seg=None if kv_seg is None else kv_seg[b, s],
                    ):
                        continue
                    score = scale * float(np.dot(q[b, t, n], k[b, s, kv_head]))
                    if slopes is not None:
                        score -= slopes[n] * abs(p - s)
                    if dense is not None:
                        score += dense[b % dense.shape[0], n % dense.shape[1], t, s]
                    keys.append(s)
                    scores.append(score)
                if not keys:
                    continue  # sees nothing: zeros
                scores = np.array(scores)
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                out[b, t, n] = weights @ v[b, keys, kv_head]
    return out


def oracle_t5_bucket(relative_position, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's relative position bucket (Raffel et al. 2020; Mesh-TensorFlow
    ``_relative_position_bucket``) of ``relative_position = key_pos - query_pos``.

    With ``bidirectional`` the buckets are split in halves, the upper half for keys after
    the query; otherwise keys after the query all share bucket 0. Within a half of ``nb``
    buckets, distances ``d < nb/2`` get their own bucket ``d``; larger ones get
    ``nb/2 + floor(log(d / (nb/2)) / log(max_distance / (nb/2)) * (nb - nb/2))``, capped
    at ``nb - 1``. Works elementwise on an int array (or a Python int).
    """
    rel = np.asarray(relative_position)
    out = np.zeros(rel.shape, np.int64)
    for idx in np.ndindex(rel.shape):
        distance = -int(rel[idx])  # > 0: the key lies before the query
        nb, offset = num_buckets, 0
        if bidirectional:
            nb //= 2
            if distance < 0:
                offset = nb
            distance = abs(distance)
        else:
            distance = max(distance, 0)
        max_exact = nb // 2
        if distance < max_exact:
            bucket = distance
        else:
            frac = math.log(distance / max_exact) / math.log(max_distance / max_exact)
            bucket = min(max_exact + int(math.floor(frac * (nb - max_exact))), nb - 1)
        out[idx] = offset + bucket
    return out


def oracle_sinusoidal(positions, D: int, base: float = 10000.0, layout: str = "interleaved"):
    """Vaswani et al. 2017: ``PE[pos, 2i] = sin(pos / base^(2i/D))``,
    ``PE[pos, 2i+1] = cos(pos / base^(2i/D))``. ``positions [...]`` -> ``[..., D]`` float64
    (an odd last channel is left zero). ``layout="half_split"`` (Marian): the sine of
    frequency i at channel i and its cosine at channel ``D/2 + i``."""
    positions = np.asarray(positions)
    out = np.zeros(positions.shape + (D,), np.float64)
    for idx in np.ndindex(positions.shape):
        pos = float(positions[idx])
        for i in range(D // 2):
            angle = pos / base ** (2.0 * i / D)
            sin_at, cos_at = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, D // 2 + i)
            out[idx + (sin_at,)] = math.sin(angle)
            out[idx + (cos_at,)] = math.cos(angle)
    return out


def oracle_rope(x, positions, base: float = 10000.0, layout: str = "interleaved"):
    """RoPE (Su et al. 2021) on pairs ``(x[2i], x[2i+1])`` (``interleaved``) or
    ``(x[i], x[i + H/2])`` (``half_split``, the Hugging Face ``rotate_half``), pair i rotated
    by the angle ``pos * base^(-2i/H)``. ``x [B,T,N,H]``, ``positions [B,T]`` -> float64."""
    x = np.asarray(x, np.float64)
    positions = np.asarray(positions)
    B, T, N, H = x.shape
    out = np.zeros_like(x)
    for b in range(B):
        for t in range(T):
            pos = float(positions[b, t])
            for i in range(H // 2):
                angle = pos * base ** (-2.0 * i / H)
                c, s = math.cos(angle), math.sin(angle)
                first, second = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, H // 2 + i)
                x0, x1 = x[b, t, :, first], x[b, t, :, second]
                out[b, t, :, first] = c * x0 - s * x1
                out[b, t, :, second] = s * x0 + c * x1
    return out


def oracle_fire(q_pos, kv_pos, c, threshold, w_in, b_in, w_out, b_out, bidirectional: bool):
    """FIRE (Li et al. 2023): ``b(i, j) = f(psi(i - j) / psi(max(L, i)))``, ``psi(x) =
    log(c x + 1)``, ``f(x) = W_out relu(W_in x + b_in) + b_out`` with one output per head;
    bidirectional (our extension): ``psi(|i - j|)`` and a second input ``[j > i]``.
    ``q_pos [T]``, ``kv_pos [S]`` -> ``[N, T, S]``, loops over query and key."""
    T, S, N = len(q_pos), len(kv_pos), w_out.shape[1]
    out = np.zeros((N, T, S))
    for t in range(T):
        for s in range(S):
            i, j = float(q_pos[t]), float(kv_pos[s])
            x = [math.log(c * abs(i - j) + 1) / math.log(c * max(threshold, i) + 1)]
            if bidirectional:
                x.append(1.0 if j > i else 0.0)
            hidden = np.maximum(np.asarray(x) @ w_in + b_in, 0.0)
            out[:, t, s] = hidden @ w_out + b_out
    return out


def oracle_abacus_places(ids, first_digit: int, from_end: bool = False):
    """Abacus places (McLeish et al. 2024): a digit's 1-based index within its number (a run
    of consecutive digit tokens, counted in the order written, or from the run's last digit
    with ``from_end``), 0 for any other token. ``ids [B,T]`` -> ``[B,T]``."""
    out = np.zeros(np.shape(ids), np.int64)
    for b, row in enumerate(np.asarray(ids)):
        place = 0
        for t, token in enumerate(row):
            place = place + 1 if first_digit <= token < first_digit + 10 else 0
            out[b, t] = place
        if from_end:  # a run of length n written 1..n becomes n..1
            t = len(row) - 1
            while t >= 0:
                n = out[b, t]
                out[b, t - n + 1 : t + 1] = out[b, t - n + 1 : t + 1][::-1]
                t -= max(n, 1)
    return out
