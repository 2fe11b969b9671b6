"""Patching sweeps and attribution patching: a sweep's grid is the one-patch-at-a-time
result, it compiles once whatever the patch values, and attribution patching tracks true
patching on trained models."""

import jax
import numpy as np
import pytest

from tfmjax.interp import PatchSweep, attribution_patch, replace, run_with_cache, run_with_patches
from tfmjax.interp.analyses import corrupt_prompts
from tfmjax.interp.patching import (
    answer_loss,
    logit_difference,
    teacher_forced_exact_match,
)

FAMILIES = ("decoder_only", "encoder_decoder")


@pytest.mark.parametrize("family", FAMILIES)
def test_sweep_cells_are_single_patches_and_it_compiles_once(rows, tiny, family):
    model, params = tiny(family)
    clean, corrupt = rows(model, seed=0), rows(model, seed=1)
    metric = logit_difference(5, 6, position=6)
    _, source = run_with_cache(model, params, clean)
    sweep = PatchSweep(model, "attn.hook_z", metric, per="position_head")
    grid = np.asarray(sweep(params, corrupt, source))
    L, T, N = model.config.num_layers, 7, model.config.num_heads
    assert grid.shape == (L, T, N)
    for l, t, n in [(0, 6, 1), (1, 3, 2), (1, 6, 0)]:
        name = f"decoder.blocks.{l}.attn.hook_z"
        edit = replace(source[name], name, positions=[t], heads=[n])
        logits, _ = run_with_patches(model, params, corrupt, {name: edit})
        np.testing.assert_allclose(grid[l, t, n], metric(logits, corrupt), rtol=1e-4, atol=1e-4)
    # Patching the target's own activations changes nothing; new values do not recompile.
    _, own = run_with_cache(model, params, corrupt)
    unpatched = metric(jax.jit(model.apply)(params, corrupt), corrupt)
    np.testing.assert_allclose(sweep(params, corrupt, own), unpatched, rtol=1e-4, atol=1e-4)
    assert sweep.compilations == 1


def test_per_layer_and_position_grids(rows, tiny):
    model, params = tiny("decoder_only")
    clean, corrupt = rows(model, seed=0), rows(model, seed=1)
    _, source = run_with_cache(model, params, clean)
    metric = logit_difference(5, 6, position=6)
    # Patching the whole residual stream before layer 0 turns the corrupt run into the clean.
    by_layer = PatchSweep(model, "hook_resid_pre", metric, per="layer")(params, corrupt, source)
    clean_value = metric(jax.jit(model.apply)(params, clean), clean)
    np.testing.assert_allclose(by_layer[0], clean_value, rtol=1e-4, atol=1e-4)
    by_position = PatchSweep(model, "hook_resid_pre", metric, per="position")(
        params, corrupt, source
    )
    assert by_position.shape == (2, 7)
    with pytest.raises(ValueError, match="no head axis"):
        PatchSweep(model, "hook_mlp_out", metric, per="head")(params, corrupt, source)


@pytest.mark.parametrize(
    "family, hook, per",
    [("decoder_only", "hook_resid_mid", "position"), ("encoder_decoder", "attn.hook_z", "head")],
)
def test_attribution_patching_tracks_true_patching_on_a_trained_model(trained, family, hook, per):
    """The first-order estimate and the true patching effect are strongly correlated (per
    layer x position of the residual stream; per layer x head of z)."""
    task, model, params, batch = trained(family)
    batch = {k: v[:12] for k, v in batch.items()}
    logits = jax.jit(model.apply)(params, batch)
    assert float(teacher_forced_exact_match(model)(logits, batch)) > 0.7
    corrupt = corrupt_prompts(_Run(task.vocab.size), batch, jax.random.PRNGKey(0))
    loss = answer_loss(model)
    _, source = run_with_cache(model, params, batch)
    base = float(loss(jax.jit(model.apply)(params, corrupt), corrupt))
    for hook, per in (("hook_resid_mid", "position"), ("attn.hook_z", "head")):
        true = np.asarray(PatchSweep(model, hook, loss, per=per)(params, corrupt, source)) - base
        estimate = np.asarray(
            attribution_patch(model, params, corrupt, source, hook, loss, per=per)
        )
        assert estimate.shape == true.shape
        r = np.corrcoef(true.ravel(), estimate.ravel())[0, 1]
        assert r > 0.6, (hook, r)


class _Run:
    """What corrupt_prompts reads of a run: the task's vocabulary size."""

    def __init__(self, vocab: int):
        self.task_vocab = vocab


def test_teacher_forced_exact_match_is_all_answer_tokens_right(tiny):
    model, params = tiny("encoder_decoder")
    targets = np.array([[6, 7, 2, 0], [6, 7, 2, 0]], np.int32)
    batch = {"inputs": targets, "targets": targets}
    logits = np.full((2, 4, model.config.vocab_size), -5.0, np.float32)
    for t, token in enumerate(targets[0]):
        logits[:, t, token] = 5.0
    logits[1, 1, 8] = 9.0  # row 1 gets its second token wrong
    logits[:, 3, 9] = 9.0  # padding positions do not count
    assert float(teacher_forced_exact_match(model)(logits, batch)) == 0.5
