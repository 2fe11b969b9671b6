"""Random parameters drawn on the host with NumPy into the shapes ``jax.eval_shape(model.init)``
reports: compiling ``model.init`` per config would cost more than most tests themselves.
Values are scaled so a random model's next-token distributions are spread out (a tied
N(0, 1) embedding makes it repeat its input with probability ~1)."""

import jax
import numpy as np


def random_params(model, seed: int = 0, embed_scale: float = 0.2):
    shapes = jax.eval_shape(model.init, jax.random.key(0), model.dummy_batch())
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']"):
            value = 1.0 + 0.1 * rng.standard_normal(leaf.shape)
        elif "embed" in name:
            value = embed_scale * rng.standard_normal(leaf.shape)
        elif "rel_bias" in name:
            value = 0.5 * rng.standard_normal(leaf.shape)
        else:
            value = 0.2 * rng.standard_normal(leaf.shape)
        return np.asarray(value, leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)
