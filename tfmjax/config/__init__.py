"""Experiment configuration: frozen dataclasses filled from TOML and overrides.

``load(path, overrides=("model.d_model=128", ...)) -> Experiment``. No config file is
executed. Every field is validated in ``__post_init__``; a bad value raises
:class:`ConfigError` with one line naming the field, the value and what is valid.

The parts: ``errors`` (ConfigError), ``checks`` (the validation helpers), ``choices`` (the
valid names of each enumerated field), ``fields`` (a field with its help line), ``model``
(ModelConfig), ``sections`` (the other sections and Experiment), ``presets``, ``loading``
(TOML, overrides, from_dict), ``compare`` (changes and diff between two experiments) and
``explain`` (the ``python -m tfmjax.config.explain`` command, not imported here).
"""

from tfmjax.config.choices import (
    ACTIVATIONS,
    ATTENTION_IMPLS,
    ATTENTIONS,
    BIDIRECTIONAL_ONLY_ATTENTIONS,
    CAUSAL_ONLY_ATTENTIONS,
    DTYPES,
    EVAL_METRICS,
    FAMILIES,
    FEATURE_MAPS,
    LOWER_IS_BETTER,
    MESH_AXES,
    NORM_POSITIONS,
    NORMS,
    PAIR_LAYOUTS,
    POSITIONS,
    RULE_SETS,
    SCHEDULES,
)
from tfmjax.config.compare import changes, diff
from tfmjax.config.errors import ConfigError
from tfmjax.config.loading import apply_overrides, from_dict, from_overridden, load, parse_value
from tfmjax.config.model import ModelConfig
from tfmjax.config.presets import PRESETS, get_preset, preset
from tfmjax.config.sections import (
    RUN_SECTIONS,
    SECTIONS,
    DataConfig,
    Experiment,
    MeshConfig,
    OptimConfig,
    TrainConfig,
)

__all__ = [
    "ACTIVATIONS",
    "ATTENTIONS",
    "ATTENTION_IMPLS",
    "BIDIRECTIONAL_ONLY_ATTENTIONS",
    "CAUSAL_ONLY_ATTENTIONS",
    "DTYPES",
    "EVAL_METRICS",
    "FAMILIES",
    "FEATURE_MAPS",
    "LOWER_IS_BETTER",
    "MESH_AXES",
    "NORMS",
    "NORM_POSITIONS",
    "PAIR_LAYOUTS",
    "POSITIONS",
    "PRESETS",
    "RULE_SETS",
    "RUN_SECTIONS",
    "SCHEDULES",
    "SECTIONS",
    "ConfigError",
    "DataConfig",
    "Experiment",
    "MeshConfig",
    "ModelConfig",
    "OptimConfig",
    "TrainConfig",
    "apply_overrides",
    "changes",
    "diff",
    "from_dict",
    "from_overridden",
    "get_preset",
    "load",
    "parse_value",
    "preset",
]
