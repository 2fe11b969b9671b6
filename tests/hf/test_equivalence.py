"""tfmjax computes what ``transformers`` computes, for every golden case.

Without torch the tests compare with the committed goldens (tests/hf/goldens, written by
make_goldens.py); with torch installed they also compare with the live torch models and
check that an export loads in ``transformers`` with the same logits.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from tfmjax import hf
from tfmjax.decode import Greedy, generate
from tfmjax.models import build

HERE = Path(__file__).parent


def make_goldens():
    spec = importlib.util.spec_from_file_location("make_goldens", HERE / "make_goldens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GOLDENS = HERE / "goldens"
TOL = 1e-4
CASES = sorted(p.name for p in GOLDENS.iterdir() if p.is_dir())
KINDS = {case: make_goldens().CASES[case][2] for case in CASES}
GENERATING = [case for case in CASES if KINDS[case] != "masked"]


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAS_TORCH = installed("torch") and installed("transformers")
live = pytest.mark.skipif(not HAS_TORCH, reason="torch and transformers are not installed")


def expected(case: str) -> dict:
    with np.load(GOLDENS / case / "expected.npz") as data:
        return dict(data)


def tfmjax_logits(case: str, cfg, params, data: dict) -> np.ndarray:
    """Logits ``[B,T,V]`` as transformers computes them: causal models see BOS as their first
    input (no shift), BERT gets its token types, encoder-decoders their decoder inputs."""
    ids = jnp.asarray(data["input_ids"], jnp.int32)
    model = build(cfg)

    def apply(*args, method=None):  # jitted: one program, not op-by-op (same values)
        return jax.jit(functools.partial(model.apply, method=method))(params, *args)

    if KINDS[case] == "masked":
        types = jnp.asarray(data["token_type_ids"], jnp.int32)
        return np.asarray(apply({"tokens": ids, "token_types": types}))
    if KINDS[case] == "seq2seq":
        encoded = apply(ids, method="encode")
        dec = jnp.asarray(data["decoder_input_ids"], jnp.int32)
        B, T = dec.shape
        positions = jnp.broadcast_to(jnp.arange(T), (B, T))
        args = (dec, positions, jnp.ones_like(dec), encoded, jnp.ones_like(ids))
        return np.asarray(apply(*args, method="decode")[0])
    B, T = ids.shape
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    logits, _ = apply(ids, positions, jnp.ones_like(ids), method="forward")
    return np.asarray(logits)


def test_goldens_record_their_versions():
    versions = json.loads((GOLDENS / "versions.json").read_text())
    assert set(versions) == {"transformers", "torch"}
    assert CASES == sorted(make_goldens().CASES)


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_the_goldens(case):
    cfg, params = hf.load(GOLDENS / case)
    data = expected(case)
    diff = np.abs(tfmjax_logits(case, cfg, params, data) - data["logits"]).max()
    assert diff < TOL, f"{case}: max |logit diff| {diff}"


@pytest.mark.parametrize("case", GENERATING)
def test_shift_right_forward_equals_the_raw_forward(case):
    """``model.apply(batch)`` feeds ``BOS, x[:-1]`` to the decoder: the goldens start with it."""
    cfg, params = hf.load(GOLDENS / case)
    data = expected(case)
    if KINDS[case] == "seq2seq":
        dec = data["decoder_input_ids"]
        batch = {"inputs": data["input_ids"], "targets": dec[:, 1:]}
    else:
        dec = data["input_ids"]
        batch = {"tokens": dec[:, 1:]}
    assert (dec[:, 0] == cfg.bos_id).all()
    batch = {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}
    logits = np.asarray(jax.jit(build(cfg).apply)(params, batch))
    np.testing.assert_allclose(logits, data["logits"][:, :-1], atol=TOL, rtol=0)


@pytest.mark.parametrize("case", GENERATING)
def test_greedy_generation_equals_the_goldens(case):
    cfg, params = hf.load(GOLDENS / case)
    data = expected(case)
    M = data["generated"].shape[1]
    out = generate(build(cfg), params, data["prompts"].astype(np.int32), Greedy(), M, eos_id=None)
    np.testing.assert_array_equal(np.asarray(out.tokens), data["generated"])


@pytest.mark.parametrize("case", CASES)
def test_save_of_load_is_byte_identical_per_tensor(case, tmp_path):
    cfg, params = hf.load(GOLDENS / case)
    raw = hf.read_config(GOLDENS / case)
    hf.save(cfg, params, tmp_path, dtype=raw["dtype"], extra=raw)
    before, after = (
        load_file(GOLDENS / case / "model.safetensors"),
        load_file(tmp_path / "model.safetensors"),
    )
    assert sorted(before) == sorted(after)
    for name, array in before.items():
        assert after[name].dtype == array.dtype and after[name].shape == array.shape, name
        assert after[name].tobytes() == array.tobytes(), name
    assert hf.config_from_hf(hf.read_config(tmp_path)) == cfg


@live
@pytest.mark.parametrize("case", CASES)
def test_logits_equal_live_torch(case):
    mg = make_goldens()
    model = mg.load_torch(GOLDENS / case, KINDS[case])
    cfg, params = hf.load(GOLDENS / case)
    data = mg.inputs(case)
    want = mg.torch_logits(model, data)
    diff = np.abs(tfmjax_logits(case, cfg, params, data) - want).max()
    assert diff < TOL, f"{case}: max |logit diff| {diff}"


@live
@pytest.mark.parametrize("case", CASES)
def test_export_loads_in_transformers_with_the_same_logits(case, tmp_path):
    mg = make_goldens()
    cfg, params = hf.load(GOLDENS / case)
    hf.save(cfg, params, tmp_path)  # float32
    data = mg.inputs(case)
    want = mg.torch_logits(mg.load_torch(GOLDENS / case, KINDS[case]), data)
    got = mg.torch_logits(mg.load_torch(tmp_path, KINDS[case]), data)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["llama_gqa", "t5_v1_1"])
def test_unrolled_layers_load_and_save_the_same(case, tmp_path):
    cfg, params = hf.load(GOLDENS / case, scan_layers=False)
    assert "layer_1" in params["params"]["encoder" if KINDS[case] == "seq2seq" else "decoder"]
    data = expected(case)
    diff = np.abs(tfmjax_logits(case, cfg, params, data) - data["logits"]).max()
    assert diff < TOL
    hf.save(cfg, params, tmp_path, dtype="float16")
    before, after = (load_file(d / "model.safetensors") for d in (GOLDENS / case, tmp_path))
    assert all(after[n].tobytes() == a.tobytes() for n, a in before.items())
