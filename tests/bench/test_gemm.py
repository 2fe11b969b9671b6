"""``bench/gemm.py`` times the matmuls a step runs: its list of dense layers must be the
model's, or its step total compares the wrong work. No figure is asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import pytest

from tfmjax.config import load
from tfmjax.models import build
from tfmjax.train.run import build_run

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gemm", ROOT / "bench" / "gemm.py")
gemm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemm)


@pytest.mark.parametrize("config", ["shakespeare_char.toml", "reverse_decoder.toml"])
def test_the_listed_matmuls_are_the_models_matmul_weights(config):
    path = ROOT / "configs" / config
    rows, layers = gemm.step_matmuls(path)
    experiment = load(path)
    context = build_run(experiment).batch(0)["tokens"].shape[1]
    assert rows == experiment.data.batch_size * context

    model = build(experiment.model)
    tokens = jax.ShapeDtypeStruct((1, 8), "int32")
    params = jax.eval_shape(model.init, jax.random.key(0), {"tokens": tokens})["params"]
    weights = 0
    for path_, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if str(getattr(path_[-1], "key", "")) == "kernel":  # a dense layer's weight
            weights += leaf.size
    if experiment.model.tie_embeddings:  # the embedding table is the output projection
        weights += experiment.model.vocab_size * experiment.model.d_model
    assert sum(k * n * count for _, k, n, count in layers) == weights


@pytest.mark.parametrize("overrides", [[], ["model.attention=linear"], ["model.moe_experts=4"]])
def test_a_model_whose_matmuls_it_does_not_list_is_refused_in_one_line(overrides, monkeypatch):
    config = "reverse.toml" if not overrides else "reverse_decoder.toml"
    monkeypatch.setattr(gemm, "load", lambda path: load(path, overrides))
    with pytest.raises(SystemExit, match="decoder-only configs with softmax attention"):
        gemm.step_matmuls(ROOT / "configs" / config)
