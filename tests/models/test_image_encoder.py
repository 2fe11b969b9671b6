"""The encoder-only family reading images (model.input = "patches"): config refusals, the
batch it takes, what it outputs and what it refuses to do."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.config import ConfigError, ModelConfig, get_preset
from tfmjax.decode import Greedy, generate
from tfmjax.decode.api import check_model
from tfmjax.models import InputError, PatchEncoder, build

VIT = get_preset("tiny-vit")
SMALL = dataclasses.replace(VIT, d_model=16, num_heads=2, d_ff=32, num_layers=1)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"family": "decoder_only"}, "model.family"),
        ({"family": "encoder_decoder"}, "model.family"),
        ({"patch_size": 3}, "model.patch_size"),
        ({"patch_size": None}, "model.patch_size"),
        ({"image_size": 0}, "model.image_size"),
        ({"max_len": 16}, "model.max_len"),
        ({"position": "rope"}, "model.position"),
        ({"tie_embeddings": True}, "model.tie_embeddings"),
        ({"type_vocab_size": 2}, "model.type_vocab_size"),
        ({"input": "pixels"}, "model.input"),
        ({"input": "tokens"}, "model.image_size"),  # image fields without images
    ],
)
def test_wrong_combinations_are_refused_in_one_line(changes, field):
    fields = {**dataclasses.asdict(VIT), **changes}
    with pytest.raises(ConfigError) as err:
        ModelConfig(**fields)
    message = str(err.value)
    assert message.startswith(f"{field}=") and "\n" not in message


def test_a_token_model_refuses_image_fields():
    with pytest.raises(ConfigError, match=r"^model.patch_size=2 is invalid: applies to"):
        ModelConfig(patch_size=2)


def test_the_preset_builds_the_patch_model_with_its_params():
    model = build(VIT)
    assert isinstance(model, PatchEncoder) and model.batch_format == "images"
    assert VIT.num_patches == 16 and VIT.patch_dim == 4
    shapes = jax.eval_shape(model.init, jax.random.key(0), model.dummy_batch())["params"]
    embed = {k: v.shape for k, v in shapes["embed"].items()}
    assert embed == {
        "kernel": (4, 64),
        "bias": (64,),
        "cls_token": (64,),
        "pos_embedding": (17, 64),
    }
    assert shapes["head"]["lm_head"]["kernel"].shape == (64, 10)


def test_logits_per_slot_and_the_class_token_reads_every_patch(random_params):
    model = build(SMALL)
    params = random_params(model)
    images = np.zeros((2, 8, 8, 1), np.float32)
    logits = jax.jit(model.apply)(params, {"images": images})
    assert logits.shape == (2, 17, 10) and logits.dtype == jnp.float32
    changed = images.copy()
    changed[:, 7, 7, 0] = 1.0  # the last patch only
    other = jax.jit(model.apply)(params, {"images": changed})
    assert not np.allclose(logits[:, 0], other[:, 0])  # bidirectional: cls sees patch 15


def test_targets_weigh_the_class_token_only():
    model = build(SMALL)
    targets, mask = model.targets_and_mask({"labels": np.array([3, 9], np.int32)})
    assert targets.shape == mask.shape == (2, 17)
    np.testing.assert_array_equal(targets[:, 0], [3, 9])
    np.testing.assert_array_equal(mask.sum(axis=1), [1.0, 1.0])
    assert float(mask[0, 0]) == 1.0
    assert model.positions_in({"images": np.zeros((5, 8, 8, 1))}) == 5 * 17


@pytest.mark.parametrize(
    "batch, match",
    [
        ({"tokens": np.ones((2, 4), np.int32)}, "needs key 'images'"),
        ({"images": np.zeros((2, 8, 8))}, r"images must be \[batch, 8, 8, 1\]"),
        ({"images": np.zeros((2, 4, 4, 1), np.float32)}, r"images must be \[batch, 8, 8, 1\]"),
        ({"images": np.full((1, 8, 8, 1), np.nan, np.float32)}, "finite floats"),
        ({"images": np.zeros((2, 8, 8, 1), np.float32), "labels": np.array([1, 10])}, "labels"),
        ({"images": np.zeros((2, 8, 8, 1), np.float32), "labels": np.array([1])}, r"\[batch\]"),
    ],
)
def test_bad_batches_are_refused_on_the_host(batch, match):
    with pytest.raises(InputError, match=match):
        build(SMALL).check_batch(batch)


def test_generation_is_refused_in_one_line(random_params):
    model = build(SMALL)
    with pytest.raises(ValueError, match="cannot generate") as err:
        generate(model, random_params(model), np.ones((1, 3), np.int32), Greedy(), 2)
    message = str(err.value)
    assert "\n" not in message and "encoder_only" not in message
    assert "patch (image) model (model.input='patches'): it has no generation" in message
    with pytest.raises(ValueError, match=r"patch \(image\) model .* has no generation"):
        check_model(model)
    with pytest.raises(NotImplementedError, match=r"model.input='patches'\) cannot generate"):
        model.eval_prompts({"images": np.zeros((1, 8, 8, 1))})


def test_positions_are_labelled_as_patches():
    labels = build(SMALL).position_labels()
    assert labels[:3] == ["cls", "patch 0 (r0,c0)", "patch 1 (r0,c1)"] and len(labels) == 17
    assert build(get_preset("tiny-bert")).position_labels() is None
