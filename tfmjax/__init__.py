"""tfmjax: a JAX/Flax model zoo of transformers."""

__version__ = "0.1.0"
