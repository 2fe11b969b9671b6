"""A tiny model trained with ``blockwise`` or ``pallas`` (interpret mode) attention follows the
``xla`` loss curve: same batches, same init, the real train step, Adam.

Blocks are shrunk to 8 so the sequences (up to ~25 tokens) span several query and key
blocks: causal block skipping, padding inside blocks and GQA all take part.
"""

import dataclasses

import numpy as np
import optax
import pytest

from tfmjax.config import ModelConfig
from tfmjax.data import make_batch, make_task
from tfmjax.kernels import blockwise, pallas_attention
from tfmjax.models import build
from tfmjax.train.state import create_state
from tfmjax.train.step import jit_train_step, make_train_step

STEPS = 5
TASK = make_task("reverse", max_len=12, num_symbols=8)
# Losses of 5 Adam steps (lr 3e-3). fp32 sums run in another order per block; measured
# differences are ~1e-7 relative, while a window one position wider changes them by ~1e-2.
RTOL = 1e-5


@pytest.fixture
def small_blocks(monkeypatch):
    """Both kernels with 8x8 blocks (and the same for the backward passes)."""
    monkeypatch.setattr(
        blockwise,
        "BlockSizes",
        lambda: dataclasses.replace(
            _BLOCKWISE_DEFAULT, block_q=8, block_k=8, block_q_bwd=8, block_k_bwd=8
        ),
    )
    eights = pallas_attention.BlockSizes(8, 8, 8, 8, 8, 8)
    monkeypatch.setattr(
        pallas_attention.BlockSizes,
        "for_platform",
        classmethod(lambda cls, platform, head_dim=64: eights),
    )


_BLOCKWISE_DEFAULT = blockwise.BlockSizes()


def _loss_curve(family: str, impl: str, **overrides) -> np.ndarray:
    cfg = ModelConfig(
        family=family,
        vocab_size=TASK.vocab.size,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        d_ff=64,
        num_layers=2,
        max_len=32,
        attention_impl=impl,
        **overrides,
    )
    model = build(cfg)
    schedule = optax.constant_schedule(3e-3)
    tx = optax.adam(schedule)
    batches = [
        make_batch(TASK, batch_format=model.batch_format, batch_size=8, seed=0, step=s)
        for s in range(STEPS)
    ]
    state = create_state(model, tx, batches[0], seed=0)
    step = jit_train_step(make_train_step(model, tx, schedule))
    losses = []
    for batch in batches:
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return np.array(losses)


CASES = [
    ("decoder_only", {"position": "rope"}),
    ("decoder_only", {"position": "alibi", "window": 6}),
    ("encoder_decoder", {"position": "sinusoidal"}),
    # BigBird: window + global + random blocks of 4, visited as candidates outside the band
    (
        "decoder_only",
        {"window": 2, "global_tokens": 1, "random_blocks": 1, "random_block_size": 4},
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("family, overrides", CASES, ids=lambda c: str(c))
def test_blockwise_follows_xla_loss_curve(small_blocks, family, overrides):
    reference = _loss_curve(family, "xla", **overrides)
    assert reference[-1] < reference[0] - 0.05, "the model must actually learn for this to test"
    np.testing.assert_allclose(_loss_curve(family, "blockwise", **overrides), reference, rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("family, overrides", [CASES[0], CASES[2]], ids=lambda c: str(c))
def test_pallas_interpret_follows_xla_loss_curve(small_blocks, family, overrides):
    reference = _loss_curve(family, "xla", **overrides)
    np.testing.assert_allclose(_loss_curve(family, "pallas", **overrides), reference, rtol=RTOL)
