"""Sweeps: seeds x hyperparameter grids of one config, trained as one command.

``python -m tfmjax.sweep CONFIG --seeds 0,1,2 --grid optim.learning_rate=1e-3,3e-3`` (see
:mod:`tfmjax.sweep.cli`). The parts: ``grid`` (axes, seeds, the runs and their validation),
``processes`` (the pool of ``train.py`` children), ``results`` (``sweep.jsonl`` and the table
over seeds), ``plots`` (the figures) and ``cli``. docs/sweeps.md is the guide.
"""
