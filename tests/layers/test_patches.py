"""The patch embedding of images as sequences (ViT): patches against a NumPy transcription of
the paper's flattening, and the learned class token and positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax.layers.patches import PatchEmbedding, image_patches, patch_labels


def numpy_patches(images: np.ndarray, p: int) -> np.ndarray:
    """Patch k = grid row k // X, column k % X; inside it pixel rows, then columns, then
    channels: written out with loops, not reshapes."""
    B, Hi, Wi, C = images.shape
    Y, X = Hi // p, Wi // p
    out = np.zeros((B, Y * X, p * p * C), images.dtype)
    for b in range(B):
        for k in range(Y * X):
            r, c = divmod(k, X)
            flat = []
            for i in range(p):
                for j in range(p):
                    for ch in range(C):
                        flat.append(images[b, r * p + i, c * p + j, ch])
            out[b, k] = flat
    return out


@pytest.mark.parametrize("shape, p", [((2, 8, 8, 1), 2), ((1, 8, 8, 1), 4), ((2, 6, 9, 3), 3)])
def test_patches_equal_a_numpy_transcription(shape, p):
    images = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(image_patches(jnp.asarray(images), p)), numpy_patches(images, p)
    )


def test_patch_size_must_divide_the_image():
    with pytest.raises(ValueError, match="must divide"):
        image_patches(jnp.zeros((1, 8, 8, 1)), 3)


def test_labels_name_the_class_token_then_each_patch_by_grid_place():
    labels = patch_labels(8, 4)
    assert labels == [
        "cls",
        "patch 0 (r0,c0)",
        "patch 1 (r0,c1)",
        "patch 2 (r1,c0)",
        "patch 3 (r1,c1)",
    ]
    assert len(patch_labels(8, 2)) == 17 and patch_labels(8, 2)[6] == "patch 5 (r1,c1)"


def _embedding(learned=True):
    return PatchEmbedding(patch_size=2, num_patches=16, d_model=8, learned_positions=learned)


def test_embedding_shapes_and_its_learned_params():
    module = _embedding()
    images = jnp.asarray(np.random.default_rng(1).random((3, 8, 8, 1)), jnp.float32)
    params = jax.tree.map(np.asarray, module.init(jax.random.key(0), images)["params"])
    params = {k: getattr(v, "value", v) for k, v in params.items()}
    assert {k: v.shape for k, v in params.items()} == {
        "kernel": (4, 8),
        "bias": (8,),
        "cls_token": (8,),
        "pos_embedding": (17, 8),
    }
    out = module.apply({"params": params}, images)
    assert out.shape == (3, 17, 8)
    # slot 0 is the class token plus position 0, the same for every image
    np.testing.assert_allclose(
        out[:, 0],
        np.broadcast_to(params["cls_token"] + params["pos_embedding"][0], (3, 8)),
        rtol=1e-6,
    )
    # slot 1 + k: patch k projected, plus position 1 + k
    patches = numpy_patches(np.asarray(images), 2)
    want = patches @ params["kernel"] + params["bias"] + params["pos_embedding"][1:]
    np.testing.assert_allclose(out[:, 1:], want, rtol=1e-5, atol=1e-6)


def test_class_token_and_positions_receive_gradients():
    module = _embedding()
    images = jnp.ones((2, 8, 8, 1))
    params = jax.tree.map(
        lambda v: getattr(v, "value", v),
        module.init(jax.random.key(0), images)["params"],
        is_leaf=lambda v: hasattr(v, "value"),
    )
    grads = jax.grad(lambda p: jnp.sum(module.apply({"params": p}, images) ** 2))(params)
    for name in ("cls_token", "pos_embedding", "kernel"):
        assert float(jnp.abs(grads[name]).sum()) > 0, name


def test_no_positions_when_not_learned():
    module = _embedding(learned=False)
    params = module.init(jax.random.key(0), jnp.ones((1, 8, 8, 1)))["params"]
    assert "pos_embedding" not in params
