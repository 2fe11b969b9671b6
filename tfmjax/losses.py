"""Token-level losses and metrics, returned as (sum, weight) pairs.

Returning sums rather than means lets callers aggregate exactly across
micro-batches, devices and eval batches, then divide once at the end.

Shapes: B batch, T length, V vocab. ``mask`` is a float [B,T] weight, 0 at
padding; masked positions contribute nothing, whatever their logits or
targets hold (even out-of-range ids or non-finite logits).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

__all__ = [
    "cross_entropy",
    "sequence_exact_match",
    "smoothed_loss_floor",
    "token_accuracy",
]


def _check_shapes(logits, targets, mask) -> None:
    if logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits must have shape targets.shape + (V,) = {targets.shape} + (V,), "
            f"got logits.shape={logits.shape}"
        )
    if mask.shape != targets.shape:
        raise ValueError(f"mask must have shape targets.shape={targets.shape}, got {mask.shape}")


def cross_entropy(
    logits: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """Masked, label-smoothed cross-entropy: logits [B,T,V], targets [B,T] int, mask [B,T].

    The target distribution is ``q = (1 - eps) * onehot(target) + eps / V``
    (Vaswani et al. 2017; ``optax.smooth_labels``), and the per-token loss is
    ``-sum_v q_v * log_softmax(logits)_v``, computed in float32. With eps > 0
    the loss cannot go below ``smoothed_loss_floor(V, eps)``.

    ``label_smoothing`` may be a traced array (unchecked): the smoothing term is then always
    computed, adding ``0 * mean(logp)`` at eps = 0, the same loss.

    Returns ``(loss_sum, weight_sum)``: float32 scalars, ``sum(loss * mask)``
    and ``sum(mask)``.
    """
    traced = isinstance(label_smoothing, jax.Array)  # one per run: tfmjax.train.stacked
    ok = isinstance(label_smoothing, numbers.Real) and 0.0 <= label_smoothing < 1.0
    if not (ok or traced):
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    _check_shapes(logits, targets, mask)
    mask = mask.astype(jnp.float32)
    keep = mask != 0
    # Padding may hold any id (e.g. -1); gather a valid one and drop it below.
    safe_targets = jnp.where(keep, targets, 0).astype(jnp.int32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B,T,V]
    target_logp = jnp.take_along_axis(logp, safe_targets[..., None], axis=-1)[..., 0]  # [B,T]
    loss = -(1.0 - label_smoothing) * target_logp  # [B,T]
    if traced or label_smoothing > 0.0:
        # sum_v (eps / V) * logp_v = eps * mean_v logp_v
        loss = loss - label_smoothing * jnp.mean(logp, axis=-1)
    # where, not multiply: 0 * inf at a masked position would be NaN.
    loss_sum = jnp.sum(jnp.where(keep, loss * mask, 0.0))
    return loss_sum, jnp.sum(mask)


def smoothed_loss_floor(vocab_size: int, label_smoothing: float) -> float:
    """Entropy of the smoothed target distribution: the least achievable smoothed loss.

    With ``q = (1 - eps) * onehot + eps / V`` this is
    ``-(a * log a + (V - 1) * b * log b)`` with ``a = 1 - eps + eps / V``,
    ``b = eps / V`` and ``0 log 0 = 0``. Subtract it from the mean loss to
    report a loss that reaches 0.
    """
    bad_v = isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral)
    if bad_v or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
    traced = isinstance(label_smoothing, jax.Array)  # one per run: tfmjax.train.stacked
    ok = isinstance(label_smoothing, numbers.Real) and 0.0 <= label_smoothing < 1.0
    if not (ok or traced):
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    v, eps = int(vocab_size), float(label_smoothing)
    a, b = 1.0 - eps + eps / v, eps / v

    def xlogx(x: float) -> float:
        return x * math.log(x) if x > 0.0 else 0.0

    return -(xlogx(a) + (v - 1) * xlogx(b))


def token_accuracy(
    logits: jax.Array, targets: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Argmax accuracy: logits [B,T,V], targets [B,T], mask [B,T].

    Returns ``(correct_sum, weight_sum)``: float32 scalars, ``sum(correct * mask)``
    and ``sum(mask)``.
    """
    _check_shapes(logits, targets, mask)
    mask = mask.astype(jnp.float32)
    correct = jnp.argmax(logits, axis=-1) == targets  # [B,T]
    return jnp.sum(jnp.where(correct, mask, 0.0)), jnp.sum(mask)


def sequence_exact_match(
    logits_or_predictions: jax.Array, targets: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Count sequences whose masked-in positions are all right.

    Shapes: ``logits_or_predictions`` [B,T,V] logits or [B,T] ids; targets, mask [B,T].

    A sequence whose mask is all zero is neither exact nor counted.
    Returns ``(num_exact, num_sequences)``: int32 scalars.
    """
    if logits_or_predictions.ndim == targets.ndim + 1:
        _check_shapes(logits_or_predictions, targets, mask)
        predictions = jnp.argmax(logits_or_predictions, axis=-1)  # [B,T]
    elif logits_or_predictions.shape == targets.shape:
        if mask.shape != targets.shape:
            raise ValueError(
                f"mask must have shape targets.shape={targets.shape}, got {mask.shape}"
            )
        predictions = logits_or_predictions
    else:
        raise ValueError(
            f"logits_or_predictions must have shape {targets.shape} (ids) or "
            f"{targets.shape} + (V,) (logits), got {logits_or_predictions.shape}"
        )
    keep = mask != 0  # [B,T]
    counted = jnp.any(keep, axis=-1)  # [B]
    all_right = jnp.all(jnp.logical_or(predictions == targets, ~keep), axis=-1)  # [B]
    num_exact = jnp.sum(jnp.logical_and(all_right, counted), dtype=jnp.int32)
    return num_exact, jnp.sum(counted, dtype=jnp.int32)
