"""What each supported Hugging Face architecture provides to the import and export."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tfmjax.config import ModelConfig
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import Mapping


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One HF architecture: its config mapping both ways and its tensor map.

    ``prefix``: the state-dict prefix of the base model inside the ``*ForCausalLM`` /
    ``*LMHeadModel`` class that export writes (rules carry it; a checkpoint of the bare base
    model, without it, is read too).
    """

    name: str
    model_types: tuple[str, ...]
    hf_class: str
    prefix: str
    config_from_hf: Callable[[Fields], ModelConfig]
    config_to_hf: Callable[[ModelConfig], dict]
    mapping: Callable[[ModelConfig], Mapping]
