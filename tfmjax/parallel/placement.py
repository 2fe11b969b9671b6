"""Where a run's arrays live on its mesh: params and optimizer state by the rules, the
batch split over the batch axes, the rest replicated; and jit with those shardings.

``Placement.for_run(experiment)`` builds the mesh (:mod:`tfmjax.parallel.mesh`) and the rule
set (:mod:`tfmjax.parallel.rules`) once. Everything traced under :meth:`Placement.context`
sees both, so the layers' logical constraints (:func:`tfmjax.layers.axes.constrain`) become
sharding constraints. State is created directly with its shardings (``jit`` of the init with
``out_shardings``): no device ever holds the whole of a sharded param.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfmjax.config import ConfigError, Experiment
from tfmjax.parallel.mesh import make_mesh
from tfmjax.parallel.rules import Rules, batch_axes, rules_for

_is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731


@dataclasses.dataclass(frozen=True)
class Placement:
    mesh: Mesh
    rules: Rules

    @classmethod
    def for_run(cls, experiment: Experiment, devices=None) -> Placement:
        mesh = make_mesh(experiment, devices)
        shape = dict(mesh.shape)
        return cls(mesh, rules_for(experiment.mesh.rules, experiment.model, shape))

    @contextlib.contextmanager
    def context(self):
        """Call functions jitted elsewhere (the evaluator, decoding) under this: they are
        traced with the mesh and the rules in force. Not inside a trace; see :meth:`jit`."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield

    @property
    def waits_each_step(self) -> bool:
        """Whether a loop must wait for each program before it dispatches the next: on CPU,
        with several devices in this process.

        A workaround for XLA:CPU (jax 0.10): each device's part of a program is launched on
        a small pool of threads (as many as cores). With the next step queued behind the
        running one, one device's launch waited on a semaphore in that pool while the other
        device's part sat in an all-reduce waiting for it; XLA aborted after 40 s (2 devices
        on 2 busy cores: 4 runs in 5). With one program in flight it never happened. Costs
        the overlap of building the next batch with the step, on CPU only.
        """
        mine = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        return len(mine) > 1 and mine[0].platform == "cpu"

    # -- shardings ---------------------------------------------------------------------

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def batch(self) -> NamedSharding:
        """Rows split over the batch axes, the other axes whole."""
        return NamedSharding(self.mesh, PartitionSpec(batch_axes(self.rules)))

    def of_logical(self, specs):
        """A tree of logical PartitionSpecs -> the tree of their NamedShardings."""
        mesh_specs = nn.logical_to_mesh(specs, self.rules)
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s), mesh_specs, is_leaf=_is_spec)

    def params(self, model, batch: dict | None = None):
        """The shardings of ``model``'s params (a tree like the params)."""
        return self.of_logical(model.param_axes(batch))

    def state(self, abstract_state, param_shardings):
        """Shardings of a train state: params as given, each optimizer-state leaf shaped like
        a param (Adam's moments) as that param, everything else replicated."""
        by_path = {
            jax.tree_util.keystr(path): (leaf.shape, sharding)
            for (path, leaf), sharding in zip(
                jax.tree_util.tree_flatten_with_path(abstract_state.params)[0],
                jax.tree.leaves(param_shardings),
                strict=True,
            )
        }

        def opt_leaf(path, leaf):
            for i in range(len(path)):  # the longest path suffix that names a param
                shape, sharding = by_path.get(jax.tree_util.keystr(path[i:]), (None, None))
                if shape == leaf.shape:
                    return sharding
            return self.replicated

        return abstract_state.replace(
            step=self.replicated,
            params=param_shardings,
            opt_state=jax.tree_util.tree_map_with_path(opt_leaf, abstract_state.opt_state),
            rng=self.replicated,
            window=jax.tree.map(lambda _: self.replicated, abstract_state.window),
        )

    # -- data and compiled functions ---------------------------------------------------

    def local_rows(self, size: int) -> slice:
        """The rows of a global batch of ``size`` rows that this process's devices hold (all
        of them in a one-process run): each process builds only these."""
        if jax.process_count() == 1:
            return slice(0, size)
        starts = [
            index[0].indices(size)[:2]
            for index in self.batch.addressable_devices_indices_map((size,)).values()
        ]
        lo, hi = min(a for a, _ in starts), max(b for _, b in starts)
        held = set().union(*(range(a, b) for a, b in starts))
        if len(held) != hi - lo:  # the rows must be one block to be built as a slice
            raise ConfigError(
                f"on mesh {dict(self.mesh.shape)} process {jax.process_index()} holds rows "
                f"that are not one block of the batch; order the mesh so that each "
                "process's devices come together (e.g. a larger mesh.data)"
            )
        return slice(lo, hi)

    def put_batch(self, batch: dict) -> dict:
        """This process's rows (:meth:`local_rows`) -> global arrays split over the batch
        axes (``jax.make_array_from_process_local_data``; the global row count is inferred)."""
        return {
            key: jax.make_array_from_process_local_data(self.batch, np.asarray(rows))
            for key, rows in batch.items()
        }

    def jit(self, fn: Callable, *, in_shardings, out_shardings, donate_argnums=(), **kw):
        """``jax.jit`` of ``fn`` with these shardings; ``fn`` is traced with the mesh (as an
        abstract mesh, which works inside any trace: ``jax.eval_shape`` of the result too)
        and the rules in force."""

        def traced(*args):
            with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
                with nn.logical_axis_rules(self.rules):
                    return fn(*args)

        return jax.jit(
            traced,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            donate_argnums=donate_argnums,
            **kw,
        )


def with_shardings(abstract, shardings):
    """The ShapeDtypeStructs of ``abstract`` carrying ``shardings`` (a restore target)."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
