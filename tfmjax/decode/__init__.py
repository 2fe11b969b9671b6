"""Generation: sampling strategies, the jitted decode loop, beam search.

    from tfmjax.decode import generate, Greedy, TopP
    out = generate(model, params, [[5, 6, 7, 3]], TopP(0.9), 16, rng=jax.random.key(0))
    out.tokens        # [B, M] int32 (M = 16 new tokens), 0 after each row's EOS

Dimension letters beyond the house ones: ``M`` new tokens, ``W`` beam width, ``P`` prompt
width. Modules: ``strategies``, ``loop`` (sampling loop), ``beam`` (beam search), ``api``
(:func:`generate`), ``reference`` (uncached twin), ``options`` (shared CLI flags). The
model-specific parts (prompt layout, KV cache, prefill, one decode step) are methods of the
model family (:mod:`tfmjax.models.family`); the cache pytree is
:class:`tfmjax.models.cache.KVCache`.
"""

from tfmjax.decode.api import generate
from tfmjax.decode.loop import GenerateOutput
from tfmjax.decode.reference import full_logits, generate_uncached
from tfmjax.decode.strategies import BeamSearch, Greedy, Temperature, TopK, TopP, nucleus_mask

__all__ = [
    "generate",
    "generate_uncached",
    "full_logits",
    "GenerateOutput",
    "Greedy",
    "Temperature",
    "TopK",
    "TopP",
    "BeamSearch",
    "nucleus_mask",
]
