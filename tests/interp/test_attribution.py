"""Direct logit attribution: the parts of the residual stream, through the final norm frozen
from the cache, add up to the logits, for both families and every norm/head option."""

import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.interp import logit_attribution, residual_parts, run_with_cache


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("decoder_only", {}),
        ("decoder_only", {"norm": "rmsnorm", "tie_embeddings": True, "position": "rope"}),
        ("decoder_only", {"output_bias": True, "num_kv_heads": 2}),
        ("encoder_decoder", {}),
        ("encoder_decoder", {"tie_embeddings": True, "scale_tied_output": True}),
    ],
)
def test_parts_sum_to_the_residual_and_contributions_to_the_logits(rows, tiny, family, overrides):
    model, params = tiny(family, **overrides)
    batch = rows(model)
    logits, cache = run_with_cache(model, params, batch)
    parts = residual_parts(model, cache)
    final = cache[f"decoder.blocks.{model.config.num_layers - 1}.hook_resid_post"]
    np.testing.assert_allclose(sum(parts.values()), final, rtol=1e-5, atol=1e-5)
    N = model.config.num_heads
    assert {f"L1H{n}" for n in range(N)} <= set(parts)
    if family == "encoder_decoder":
        assert {f"L0X{n}" for n in range(N)} | {"L0cross_bias"} <= set(parts)
    names, full = logit_attribution(model, params, cache)
    assert full.shape == (len(names), 3, 7, model.config.vocab_size)
    np.testing.assert_allclose(jnp.sum(full, 0), logits, rtol=1e-5, atol=1e-5)
    # The logit of chosen tokens, and of a difference of two tokens, add up too.
    tokens = jnp.asarray(batch[model.token_keys[-1]])
    _, own = logit_attribution(model, params, cache, tokens=tokens)
    picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(jnp.sum(own, 0), picked, rtol=1e-5, atol=1e-5)
    other = (tokens + 1) % model.config.vocab_size
    _, diff = logit_attribution(model, params, cache, tokens=(tokens, other))
    other_logit = jnp.take_along_axis(logits, other[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(jnp.sum(diff, 0), picked - other_logit, rtol=1e-4, atol=1e-4)


def test_post_norm_models_are_refused_in_one_line(rows, tiny):
    model, params = tiny("decoder_only", norm_position="post")
    _, cache = run_with_cache(model, params, rows(model))
    with pytest.raises(ValueError, match="needs a pre-norm model"):
        residual_parts(model, cache)
