"""A checkpoint's saved config, read by a newer tfmjax: the fields added since with a default
that would change what the saved run did get the value that reproduces it.

A field missing from a saved config otherwise loads at its default, which the project's rule
makes the old behaviour. The exception is a default chosen to change behaviour:

- ``model.moe_eval_capacity_factor`` (the capacity factor of a forward without dropout)
  defaults to 0, dropless; before it existed, evaluation and decoding took the training
  factor ``moe_capacity_factor``, which ``None`` says.
"""

from __future__ import annotations


def upgrade_saved(config: dict) -> dict:
    """``config`` (an :meth:`Experiment.to_dict` as a checkpoint saved it) with the fields an
    older version lacked set to what that version did; a copy, or ``config`` itself when
    nothing is missing."""
    model = config.get("model")
    if (
        isinstance(model, dict)
        and "moe_capacity_factor" in model
        and "moe_eval_capacity_factor" not in model
    ):
        return {**config, "model": {**model, "moe_eval_capacity_factor": None}}
    return config
