"""Evaluation and generation on a mesh: a checkpoint trained on ``data=2 x fsdp=2 x
tensor=2`` (8 simulated devices) is restored onto its own mesh, split as the rules say, and
evaluates and decodes as on one device; on fewer devices its mesh shrinks, with one line.

The two-process run of ``eval.py`` is in ``test_processes.py`` (it reuses the workdir that
test trains).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import tfmjax.checkpoint.inference as inference
from tfmjax.checkpoint import CheckpointError, load_for_inference, load_on_mesh
from tfmjax.config import ConfigError, MeshConfig, from_dict, load
from tfmjax.data import make_task
from tfmjax.decode import Greedy, generate
from tfmjax.evaluation.report import evaluate_checkpoint
from tfmjax.generate import generate_texts, main
from tfmjax.models import build
from tfmjax.parallel import fit_mesh, inference_placement

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/reverse_decoder.toml"
SMALL = [
    "model.d_model=32",
    "model.num_heads=4",
    "model.d_ff=64",
    "model.num_layers=1",
    "model.max_len=32",
    "data.batch_size=16",
    "data.eval_examples=16",
    "optim.warmup_steps=1",
    "optim.learning_rate=1e-2",
    "train.steps=3",
    "train.eval_every=100",
    "train.checkpoint_every=3",
    "mesh.data=2",
    "mesh.fsdp=2",
    "mesh.tensor=2",
]
TRAINED_ON = "data=2 x fsdp=2 x tensor=2"
ONE = "data=1 x fsdp=1 x tensor=1"
IDS = ["5 6 7 3", "8 4"]
INPUTS = ["c a b", "d e f g"]
HANG_S = 600  # a hang guard for the eval.py run, not a speed limit

pytestmark = pytest.mark.xdist_group("mesh")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from tfmjax.train import train

    path = tmp_path_factory.mktemp("mesh_eval") / "run"
    train(load(CONFIG, [*SMALL, f"train.workdir={path}"]), progress=False, plot=False)
    return path


@pytest.mark.parametrize(
    "sizes, devices, every_device, want",
    [
        ((2, 2, 2), 8, False, (2, 2, 2)),  # fits: kept
        ((2, 2, 2), 4, False, (1, 2, 2)),  # data goes first
        ((2, 2, 2), 2, False, (1, 2, 1)),  # then tensor; fsdp, what makes a model fit, last
        ((2, 2, 2), 1, False, (1, 1, 1)),
        ((4, 1, 1), 6, False, (2, 1, 1)),  # the largest divisor that fits
        ((1, -1, 1), 4, False, (1, 4, 1)),  # -1 still takes the rest
        ((1, 1, 1), 8, True, (8, 1, 1)),  # several processes: every device takes part
        ((1, 2, 2), 8, True, (2, 2, 2)),
    ],
)
def test_fit_mesh_shrinks_data_then_tensor_then_fsdp(sizes, devices, every_device, want):
    cfg = MeshConfig(*sizes)
    got = fit_mesh(cfg, devices, every_device)
    assert (got["data"], got["fsdp"], got["tensor"]) == want and got["expert"] == 1


def _shard_shapes(params) -> dict[str, tuple]:
    out = {}
    for path, leaf in jax.tree.leaves_with_path(params):
        shapes = {tuple(s.data.shape) for s in leaf.addressable_shards}
        assert len(shapes) == 1
        out["/".join(str(k.key) for k in path)] = shapes.pop()
    return out


def test_params_restore_onto_the_checkpoints_mesh_split_as_the_rules_say(workdir, monkeypatch):
    """Default: the checkpoint's own 2x2x2 mesh, no line; each device holds the shard the
    standard rules give (read from the arrays' shards), the values are the one-device
    load's bit for bit, and the integrity hash was computed over those sharded arrays."""
    hashed = []
    real_hash = inference.params_hash

    def spy(tree):
        hashed.append({leaf.sharding for leaf in jax.tree.leaves(tree)})
        return real_hash(tree)

    monkeypatch.setattr(inference, "params_hash", spy)
    loaded = load_on_mesh(workdir)
    assert loaded.step == 3 and loaded.note is None
    assert dict(loaded.placement.mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
    shards = _shard_shapes(loaded.params)
    # [V=16, D=32]: vocabulary over tensor, embed over fsdp; [1, D, N=4, H=8]: embed over
    # fsdp, heads over tensor; [1, F=64, D]: FFN width over tensor, embed over fsdp.
    assert shards["params/embed/token_embed/embedding"] == (8, 16)
    assert shards["params/decoder/layers/attention/query/kernel"] == (1, 16, 2, 8)
    assert shards["params/decoder/layers/mlp/down/kernel"] == (1, 32, 16)
    assert shards["params/head/lm_head/kernel"] == (16, 8)
    (shardings,) = hashed
    assert all(len(s.device_set) == 8 for s in shardings)
    _, one, step = load_for_inference(workdir)
    assert step == 3
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params), one)

    monkeypatch.setattr(inference, "params_hash", lambda tree: "not the saved hash")
    with pytest.raises(CheckpointError, match="array hash mismatch"):
        load_on_mesh(workdir)


def test_the_mesh_shrinks_to_the_devices_present_or_follows_the_overrides(workdir):
    """One device: the 2x2x2 checkpoint loads onto one device, saying so in one line;
    mesh.* overrides apply on top of the checkpoint's mesh; others are refused."""
    loaded = load_on_mesh(workdir, devices=jax.devices()[:1])
    assert dict(loaded.placement.mesh.shape) == {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
    assert set(_shard_shapes(loaded.params).values()) == {
        leaf.shape for leaf in jax.tree.leaves(loaded.params)
    }  # whole on the one device
    assert loaded.note == (
        f"mesh {ONE}, not the checkpoint's {TRAINED_ON}: fitted to the 1 cpu device here"
    )
    experiment = from_dict(loaded.config)
    placement, note = inference_placement(experiment, ["mesh.data=1", "mesh.fsdp=-1"])
    assert dict(placement.mesh.shape) == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}
    assert "mesh data=1 x fsdp=4 x tensor=2, not the checkpoint's" in note
    for overrides, message in [
        (["model.d_model=8"], "only mesh.* settings"),
        (["mesh.data=3"], "needs a multiple of 12 devices"),
        (
            ["mesh.data=1", "mesh.fsdp=1", "mesh.tensor=8"],
            "mesh.tensor=8 does not divide model.num_heads",
        ),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)) as err:
            load_on_mesh(workdir, overrides)
        assert "\n" not in str(err.value)


def test_eval_on_the_mesh_equals_one_device(workdir):
    """evaluate_checkpoint on the checkpoint's mesh (eval.py's default) gives the one-device
    report: metrics within 1e-5 relative, every decoded example the same."""
    said = []
    got = evaluate_checkpoint(workdir, num_rows=16, mesh=[], say=said.append)
    want = evaluate_checkpoint(workdir, num_rows=16)  # the one-device path
    assert said == [] and got["mesh"] == TRAINED_ON and want["mesh"] == ONE
    for key in ("loss", "perplexity", "token_accuracy", "exact_match"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    assert got["examples"] == want["examples"] and len(got["examples"]) == 16
    assert len({row["prediction"] for row in got["examples"]}) > 1  # not one constant answer


def test_generate_on_the_mesh_equals_one_device(workdir, capsys, monkeypatch):
    """python -m tfmjax.generate on the checkpoint's mesh prints the greedy ids and answers
    of a plain one-device generate call, decoding with the sharded params under the mesh."""
    import tfmjax.decode as decode

    seen = []

    def spy(model, params, *args, **kwargs):
        leaf = jax.tree.leaves(params)[0]
        seen.append((dict(leaf.sharding.mesh.shape), dict(jax.sharding.get_abstract_mesh().shape)))
        return generate(model, params, *args, **kwargs)

    monkeypatch.setattr(decode, "generate", spy)
    argv = [str(workdir), *(f for i in IDS for f in ("--ids", i)), "--max-new-tokens", "12"]
    assert main(argv) == 0
    ids_run = capsys.readouterr()
    assert main([str(workdir), *(f for i in INPUTS for f in ("--input", i))]) == 0
    text_run = capsys.readouterr()
    monkeypatch.undo()
    assert ids_run.err == text_run.err == ""  # the checkpoint's own mesh: no line
    mesh = {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
    assert seen == [(mesh, mesh), (mesh, mesh)]

    config, params, _ = load_for_inference(workdir)  # one device, no mesh in force
    experiment = from_dict(config)
    prompts = [[int(t) for t in text.split()] for text in IDS]
    ids = generate(build(experiment.model), params, prompts, Greedy(), 12, eos_id=None).tokens
    assert ids_run.out.splitlines() == [
        f"{text} -> {' '.join(map(str, row))}"
        for text, row in zip(IDS, np.asarray(ids).tolist(), strict=True)
    ]
    task = make_task("reverse", **experiment.data.task_params)
    n = task.max_target_len("eval") + 1
    answers = generate_texts(experiment.model, params, task.vocab, INPUTS, Greedy(), n, task=task)
    lines = [line.rstrip() for line in text_run.out.splitlines()]
    assert lines == [f"{t} -> {a}".rstrip() for t, a in zip(INPUTS, answers, strict=True)]


def test_eval_cli_on_one_device_says_which_mesh_and_equals_the_mesh_report(workdir, tmp_path):
    """eval.py in a process with one device: the 2x2x2 checkpoint runs on one device, one
    stderr line says so, and the report equals the in-process 8-device mesh report. The
    training package is never imported (``-X importtime`` lists every module imported)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_NUM_CPU_DEVICES"] = "1"
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "eval.py"), str(workdir), "--rows", "16"]
        + ["--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = f"mesh {ONE}, not the checkpoint's {TRAINED_ON}: fitted to the 1 cpu device here"
    assert line in proc.stderr.splitlines()
    imported = [row.rsplit("|", 1)[-1].strip() for row in proc.stderr.splitlines() if "|" in row]
    assert "tfmjax.evaluation.report" in imported
    assert not [name for name in imported if name.startswith("tfmjax.train")]
    got = json.loads(out.read_text())
    want = evaluate_checkpoint(workdir, num_rows=16, mesh=[])
    assert got["mesh"] == ONE and want["mesh"] == TRAINED_ON
    for key in ("loss", "perplexity", "token_accuracy", "exact_match"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    assert got["examples"] == want["examples"]
