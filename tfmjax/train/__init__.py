"""Training: state, schedules, optimizer, pure steps, building a run, stopping, the loop.

    from tfmjax.train import train          # the loop (resumes from the workdir)
    from tfmjax.train import TrainState, make_train_step, make_eval_step

Names are imported lazily, so ``import tfmjax.train.step`` does not pull in Orbax.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainState": "tfmjax.train.state",
    "create_state": "tfmjax.train.state",
    "abstract_state": "tfmjax.train.state",
    "make_train_step": "tfmjax.train.step",
    "make_eval_step": "tfmjax.train.step",
    "jit_train_step": "tfmjax.train.step",
    "train": "tfmjax.train.loop",
    "NonFiniteLossError": "tfmjax.train.loop",
    "build_run": "tfmjax.train.run",
    "StopSignals": "tfmjax.train.stopping",
    "Interrupted": "tfmjax.train.stopping",
    "plot_metrics": "tfmjax.train.plots",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tfmjax.train' has no attribute {name!r}")
