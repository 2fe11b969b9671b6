"""Many devices: the mesh, the logical-axis rules, where arrays live, many processes.

See :mod:`tfmjax.parallel.rules` for the rule sets and :mod:`tfmjax.parallel.placement` for
how a run's state, batches and compiled steps are laid out;
:mod:`tfmjax.parallel.inference` for the mesh that evaluation and generation run on.
"""

from tfmjax.parallel.inference import inference_placement
from tfmjax.parallel.mesh import check_fits, fit_mesh, make_mesh, mesh_shape, mesh_text
from tfmjax.parallel.placement import Placement, with_shardings
from tfmjax.parallel.rules import RULE_SETS, rules_for

__all__ = [
    "RULE_SETS",
    "Placement",
    "check_fits",
    "fit_mesh",
    "inference_placement",
    "make_mesh",
    "mesh_shape",
    "mesh_text",
    "rules_for",
    "with_shardings",
]
