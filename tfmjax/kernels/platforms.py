"""The platforms a computation can be lowered for, and the Pallas kernel flavour of each.

Names are those of ``jax.lax.platform_dependent``: Triton on cuda and rocm, Mosaic on tpu,
the interpreter on cpu. No other platform has a Pallas backend. Its own module so that the
entry point (``tfmjax.kernels``) and the Pallas wrapper share it without importing each other.
"""

PALLAS_FLAVOUR = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "tpu": "tpu"}
LOWERING_PLATFORMS = tuple(PALLAS_FLAVOUR)
