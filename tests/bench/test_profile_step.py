"""bench/profile_step.py: the kernel groups of HLO instructions, the idle time of a trace,
and a traced quick run on the CPU (the plumbing: a GPU run fills docs/gpu_speed.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import profile_step  # noqa: E402

HLO = {
    "dot.1": "f32[8,16]{1,0} dot(f32[8,4] %a, f32[4,16] %b), lhs_contracting_dims={1}, "
    'metadata={op_name="jit(step)/decoder/layers/attention/query/dot_general"}',
    "gemm_fusion.2": "bf16[8,16]{1,0} fusion(bf16[8,4] %a), kind=kCustom, "
    'calls=%gemm_fusion_dot.2, metadata={op_name="jit(step)/decoder/layers/mlp/up/dot_general"}',
    "fusion.3": "f32[8,16]{1,0} fusion(f32[8,16] %x), kind=kLoop, calls=%fused_computation.3, "
    'metadata={op_name="jit(step)/jvp(DecoderOnly)/decoder/layers/mlp_norm/rsqrt"}',
    "fusion.4": "f32[8,16]{1,0} fusion(f32[8,16] %x), kind=kInput, calls=%fused.4, "
    'metadata={op_name="jit(step)/loss/reduce_max"}',
    "copy.2": 'f32[8,16]{0,1} copy(f32[8,16] %x), metadata={op_name="jit(step)/transpose"}',
    "custom-call.1": 'bf16[8] custom-call(bf16[8] %q), custom_call_target="__cudnn$fmhaSoftmax"',
    "fusion.5": "f32[64]{0} fusion(f32[64] %m), kind=kLoop, calls=%f.5, "
    'metadata={op_name="jit(step)/optimizer/sqrt"}',
    "fusion.9": "f32[8,16]{1,0} fusion(f32[8,16] %x), kind=kLoop, calls=%f, "
    'metadata={op_name="jit(step)/decoder/layers/mlp/gelu/erf"}',
}
WANT = {
    "dot.1": "matmul",  # a projection inside the attention module is still a matmul
    "gemm_fusion.2": "matmul",
    "fusion.3": "norms",
    "fusion.4": "softmax+CE",
    "copy.2": "copies",
    "custom-call.1": "attention",
    "fusion.5": "optimizer",
    "fusion.9": "other",
}


def test_each_instruction_lands_in_its_group():
    texts = profile_step.instruction_texts(
        "\n".join(f"  %{name} = {line}" for name, line in HLO.items())
    )
    assert set(texts) == set(HLO)
    assert {name: profile_step.group_of(name, texts) for name in HLO} == WANT


def test_idle_is_the_wall_not_covered_by_kernels():
    """Two overlapping kernels on a GPU stream and one later: 30 us covered of a 100 us wall."""
    trace = {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "XLA Ops"}},
            {"ph": "X", "pid": 1, "tid": 2, "name": "dot.1", "ts": 0, "dur": 10},
            {"ph": "X", "pid": 1, "tid": 2, "name": "fusion.3", "ts": 5, "dur": 10},
            {"ph": "X", "pid": 1, "tid": 2, "name": "copy.2", "ts": 50, "dur": 15},
            {"ph": "X", "pid": 9, "tid": 2, "name": "host work", "ts": 0, "dur": 99},
        ]
    }
    hlo = "\n".join(f"%{name} = {line}" for name, line in HLO.items())
    table = profile_step.reduce_trace(trace, hlo, "gpu", steps=1, wall_us=100.0)
    assert table["kernels"] == 3
    assert table["groups"]["idle"]["us_per_step"] == pytest.approx(70.0)
    assert table["groups"]["matmul"]["us_per_step"] == 10
    assert table["groups"]["norms"]["us_per_step"] == 10
    assert table["groups"]["copies"]["share"] == pytest.approx(15 / 35)


def test_a_quick_cpu_run_writes_the_table(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "profile_step.py"), "--quick"]
        + ["--warm", "1", "--steps", "2", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads((tmp_path / "profile.json").read_text())
    assert set(table["groups"]) == {*profile_step.GROUPS, "idle"}
    assert table["kernels"] > 0 and table["wall_us_per_step"] > 0
    shares = sum(table["groups"][g]["share"] for g in profile_step.GROUPS)
    assert shares == pytest.approx(1.0)
    assert (tmp_path / "profile.md").read_text().startswith("### ")
