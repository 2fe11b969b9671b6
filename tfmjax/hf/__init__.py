"""Hugging Face checkpoints: ``load(directory) -> (ModelConfig, params)`` and
``save(config, params, directory)`` for GPT-2, Llama, BERT, BART, Marian and T5;
``load_tokenizer(directory)``: the tokenizer saved beside them (None without one).

Files: ``tensors`` (safetensors through NumPy), ``fields`` (reading ``config.json`` field by
field, refusing what tfmjax cannot honour), ``mapping`` (exact, invertible tensor maps),
``arch`` (what an architecture provides), one module per architecture, ``api`` (load and
save), ``tokenizer`` (the ``tokenizer.json`` beside the weights, read and written back),
``cli`` (``python -m tfmjax.hf import|export``).
"""

from tfmjax.hf.api import ARCHITECTURES, architecture_for, config_from_hf, load, read_config, save
from tfmjax.hf.errors import HFError
from tfmjax.hf.tokenizer import read as load_tokenizer

__all__ = [
    "ARCHITECTURES",
    "HFError",
    "architecture_for",
    "config_from_hf",
    "load",
    "load_tokenizer",
    "read_config",
    "save",
]
