"""Generation: KV cache, sampling strategies, the jitted decode loop, beam search.

    from tfmjax.decode import generate, Greedy, TopP
    out = generate(model, params, [[5, 6, 7, 3]], TopP(0.9), 16, rng=jax.random.key(0))
    out.tokens        # [B, 16] int32, 0 after each row's EOS

Modules: ``cache`` (the KV-cache pytree), ``prompts`` (input checks, left padding),
``steps`` (prefill / one-token step), ``strategies``, ``loop`` (sampling loop), ``beam``
(beam search), ``api`` (:func:`generate`), ``reference`` (uncached twin).
"""
from tfmjax.decode.api import generate
from tfmjax.decode.cache import KVCache, config_kv_cache_bytes, init_cache, kv_cache_bytes
from tfmjax.decode.loop import GenerateOutput
from tfmjax.decode.prompts import DecoderPrompt, left_pad_decoder_prompts
from tfmjax.decode.reference import full_logits, generate_uncached
from tfmjax.decode.steps import decode_step, prefill_decoder_only, prefill_encoder_decoder
from tfmjax.decode.strategies import (BeamSearch, Greedy, Temperature, TopK, TopP,
                                      nucleus_mask)

__all__ = ["generate", "generate_uncached", "full_logits", "GenerateOutput", "KVCache",
           "init_cache", "kv_cache_bytes", "config_kv_cache_bytes", "DecoderPrompt",
           "left_pad_decoder_prompts", "prefill_decoder_only", "prefill_encoder_decoder",
           "decode_step", "Greedy", "Temperature", "TopK", "TopP", "BeamSearch", "nucleus_mask"]
