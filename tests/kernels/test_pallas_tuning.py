"""The Triton settings table (:mod:`tfmjax.kernels.pallas_tuning`): which row a call takes,
and that the row's blocks, warps and stages reach the kernels of a cuda lowering built on
this CPU host (each Triton call's backend config names its kernel, ``num_warps``,
``num_stages`` and grid); other GPUs and explicit block sizes keep the defaults."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import tfmjax.kernels.pallas_attention as pallas_attention
import tfmjax.kernels.pallas_tuning as pallas_tuning
from tfmjax.compat import gpu_lowering_target
from tfmjax.kernels import attention
from tfmjax.kernels.pallas_attention import BlockSizes
from tfmjax.kernels.pallas_tuning import DEFAULT_LAUNCH, Launch, gpu_family, triton_settings

# Two measured rows, with settings unlike the defaults in every field.
ROWS = {
    ("hopper", 1024, 64, True): ((64, 64, 8, 3), (64, 64, 8, 1), (64, 64, 2, 4)),
    ("hopper", 4096, 64, True): ((128, 128, 8, 4), (32, 128, 4, 3), (128, 32, 8, 3)),
}


@pytest.mark.parametrize(
    "kind, family",
    [
        ("NVIDIA H100 80GB HBM3", "hopper"),
        ("NVIDIA H100 PCIe", "hopper"),
        ("NVIDIA H200", "hopper"),
        ("NVIDIA GH200 480GB", "hopper"),
        ("NVIDIA H20", "hopper"),
        ("NVIDIA A100-SXM4-80GB", "ampere"),
        ("NVIDIA A10G", None),  # not an A10: its own chip, no row
        ("NVIDIA GeForce RTX 4090", "ada"),
        ("NVIDIA L4", "ada"),
        ("NVIDIA B200", "blackwell"),
        ("AMD Instinct MI300X", None),
        ("cpu", None),
        (None, None),
    ],
)
def test_gpu_family_of_device_kinds(kind, family):
    assert gpu_family(kind) == family


def test_no_row_keeps_the_defaults():
    assert pallas_tuning.TUNED == {} or all(len(v) == 3 for v in pallas_tuning.TUNED.values())
    blocks, launch, key = triton_settings(4096, 4096, 64, True, "NVIDIA A100-SXM4-80GB")
    assert (blocks, launch, key) == (BlockSizes.for_platform("cuda", 64), DEFAULT_LAUNCH, None)


@pytest.mark.parametrize(
    "T, S, want",
    [(1024, 1024, 1024), (2000, 2000, 1024), (2048, 2048, 1024), (3000, 3000, 4096),
     (256, 256, 1024), (16384, 16384, 4096), (512, 8192, 1024), (1024, 16384, 4096)],
)  # fmt: skip
def test_nearest_length_on_a_log_scale(monkeypatch, T, S, want):
    """sqrt(T*S) against the measured lengths; a tie (2048: one octave each way) takes the
    shorter row."""
    monkeypatch.setattr(pallas_tuning, "TUNED", ROWS)
    blocks, launch, key = triton_settings(T, S, 64, True, "NVIDIA H200")
    assert key == ("hopper", want, 64, True)
    fwd, dkv, dq = ROWS[key]
    assert blocks == BlockSizes(*fwd[:2], *dkv[:2], *dq[:2])
    assert launch == Launch(fwd[2:], dkv[2:], dq[2:])


@pytest.mark.parametrize(
    "head_dim, causal, kind, hit",
    [(64, True, "NVIDIA H100 80GB HBM3", True), (48, True, "NVIDIA H200", True),
     (128, True, "NVIDIA H200", False), (64, False, "NVIDIA H200", False),
     (64, True, "NVIDIA A100-SXM4-80GB", False), (64, True, None, False)],
)  # fmt: skip
def test_a_row_needs_its_family_width_and_causality(monkeypatch, head_dim, causal, kind, hit):
    """Head width 48 is padded to 64, so it takes the 64 row; nothing else matches."""
    monkeypatch.setattr(pallas_tuning, "TUNED", ROWS)
    blocks, launch, key = triton_settings(1024, 1024, head_dim, causal, kind)
    assert (key is not None) == hit
    if not hit:
        assert (blocks, launch) == (BlockSizes.for_platform("cuda", head_dim), DEFAULT_LAUNCH)


@pytest.mark.parametrize("bad", [(3, 2), (4, 0), (32, 2), (4, 9)])
def test_launch_refuses_what_triton_cannot_take(bad):
    with pytest.raises(ValueError, match="num_warps must be 1, 2, 4, 8 or 16"):
        Launch(fwd=bad)


def _triton_calls(device_kind, T=1024, H=64, causal=True, **kw):
    """``{kernel name: (num_warps, num_stages, grid_z)}`` of a cuda lowering of the gradient
    (the forward runs in it too) built for ``device_kind`` from this host."""
    q = jnp.zeros((1, T, 2, H), jnp.bfloat16)

    def loss(q):
        if kw:  # options of the Pallas wrapper itself
            out = pallas_attention.attention(
                q, q, q, causal=causal, q_segment_ids=None, kv_segment_ids=None, window=None,
                alibi_slopes=None, bias=None, q_offset=0, scale=H**-0.5, **kw,
            )  # fmt: skip
        else:
            out = attention(q, q, q, causal=causal, impl="pallas")
        return out.astype(jnp.float32).sum()

    with gpu_lowering_target(device_kind):
        text = jax.jit(jax.grad(loss)).trace(q).lower(lowering_platforms=("cuda",)).as_text()
    configs = re.findall(
        r'grid_z = (\d+) : i32, ir = ".*?", name = "(tfmjax_flash_\w+?)", '
        r"num_stages = (\d+) : i32, num_warps = (\d+)",
        text,
    )
    calls = {name.split("_")[-1]: (int(w), int(s), int(z)) for z, name, s, w in configs}
    assert sorted(calls) == ["dkv", "dq", "fwd"], calls
    return calls


def test_the_row_reaches_each_triton_kernel(monkeypatch):
    """T=1024 on an H200 takes the 1024 row: each kernel's warps and stages, and the grid
    its query block (fwd, dQ: T / block_q) or key block (dK/dV: S / block_k) gives."""
    monkeypatch.setattr(pallas_tuning, "TUNED", ROWS)
    fwd, dkv, dq = ROWS[("hopper", 1024, 64, True)]
    assert _triton_calls("NVIDIA H200") == {
        "fwd": (fwd[2], fwd[3], 1024 // fwd[0]),
        "dkv": (dkv[2], dkv[3], 1024 // dkv[1]),
        "dq": (dq[2], dq[3], 1024 // dq[0]),
    }


def test_other_gpus_and_explicit_blocks_keep_the_defaults(monkeypatch):
    monkeypatch.setattr(pallas_tuning, "TUNED", ROWS)
    defaults = BlockSizes.for_platform("cuda", 64)
    want = {
        "fwd": (4, 2, 1024 // defaults.block_q),
        "dkv": (4, 2, 1024 // defaults.block_k_dkv),
        "dq": (4, 2, 1024 // defaults.block_q_dq),
    }
    assert _triton_calls("NVIDIA A100-SXM4-80GB") == want
    assert _triton_calls("NVIDIA H200", causal=False) == want
    explicit = BlockSizes(*[64] * 6)  # the user's blocks: the default launch, not the row's
    assert _triton_calls("NVIDIA H200", block_sizes=explicit) == {
        name: (4, 2, 1024 // 64) for name in ("fwd", "dkv", "dq")
    }


def test_an_explicit_launch_is_what_runs():
    """What the sweep passes: its own warps and stages with the default blocks."""
    launch = Launch(fwd=(8, 3), dkv=(2, 1), dq=(16, 4))
    calls = _triton_calls("NVIDIA A100-SXM4-80GB", launch=launch)
    assert {name: call[:2] for name, call in calls.items()} == {
        "fwd": (8, 3),
        "dkv": (2, 1),
        "dq": (16, 4),
    }
