"""A mixture-of-experts model trained with a capacity (1.25, Switch's; the default trains
dropless) decodes what its own forward predicts under the default evaluation capacity, in
both families: KV-cached greedy decoding (one token a step, a group of one: never drops)
equals the uncached rollout, each token the argmax of the full forward over the prefix,
which runs without dropout and so takes the evaluation capacity (dropless by default). A
forward with a tight evaluation capacity disagrees, which shows the comparison can tell."""

import dataclasses

import numpy as np
import pytest

import tfmjax
from tfmjax.decode import Greedy, generate, generate_uncached
from tfmjax.models import build

PROMPTS = 48


@pytest.mark.slow  # trains two models for 150 steps
@pytest.mark.parametrize("config", ["configs/copy_decoder.toml", "configs/copy.toml"])
def test_a_trained_moe_model_decodes_what_its_forward_predicts(
    config, tmp_path, capsys, script_main
):
    argv = [
        config,
        "--progress",
        "lines",
        "model.moe_experts=4",
        "model.moe_top_k=2",
        "model.moe_capacity_factor=1.25",
        "model.d_model=32",
        "model.d_ff=64",
        "data.batch_size=32",
        "data.eval_examples=32",
        "train.steps=150",
        "train.eval_every=150",
        "train.checkpoint_every=150",
        f"train.workdir={tmp_path}",
    ]
    assert script_main("train")(argv) == 0, capsys.readouterr().err
    m = tfmjax.load(tmp_path)
    cfg = m.config.model
    assert cfg.moe_eval_capacity_factor == 0.0  # the default

    task = m.source.task
    rng = np.random.default_rng(0)
    prompts = [m.model.prompt_for_source(task.sample(rng, "eval")[0]) for _ in range(PROMPTS)]
    new = task.max_target_len("eval") + 1
    cached = generate(m.model, m.params, prompts, Greedy(), new)
    rollout = generate_uncached(m.model, m.params, prompts, new)
    np.testing.assert_array_equal(cached.lengths, rollout.lengths)
    np.testing.assert_array_equal(cached.tokens, rollout.tokens)

    tight = build(dataclasses.replace(cfg, moe_eval_capacity_factor=0.25))
    dropping = generate_uncached(tight, m.params, prompts, new)
    assert not np.array_equal(dropping.tokens, cached.tokens)
