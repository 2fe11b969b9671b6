"""Hook points: named activations that interpretability tools read and replace.

A module calls ``x = hook(self, "hook_q", x)`` at each activation worth naming. Outside
:func:`hooks_active` (training, decoding, a plain ``apply``) ``hook`` returns ``x`` untouched
at trace time, so the compiled program is the one without hooks. Inside it (see
:mod:`tfmjax.interp`), a hook

- applies the edit registered for its full name (``edits[name](x)``: patching, ablation), then
- records ``x`` in the ``"intermediates"`` collection when that collection is mutable and the
  name is captured.

Full names follow TransformerLens with a stack prefix, built from the module path of an
unrolled model: ``decoder.blocks.{l}.attn.hook_q`` for ``decoder/layer_{l}/attention``; the
output head's final norm is ``{stack}.ln_final`` for the stack the head reads (``head_stack``).
Modules outside the stacks pass a name that is already full (``decoder.hook_embed``).
Hooks inside a scanned stack are not supported (:mod:`tfmjax.interp` unrolls the layers).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Callable, Mapping

import flax.linen as nn

COLLECTION = "intermediates"

# Module names of the model -> their TransformerLens names (None: not part of the name).
_RENAME = {
    "attention": "attn",
    "cross_attention": "cross_attn",
    "attention_norm": "ln1",
    "cross_attention_norm": "ln_cross",
    "mlp_norm": "ln2",
    "final_norm": "ln_final",
    "encoder_norm": "encoder.ln_final",
    "embed": None,
}
_LAYER = re.compile(r"layer_(\d+)$")
# Recorded only when named (or ``every``): TransformerLens's split inputs, the residual
# repeated per head, N times its memory (TransformerLens records them only when switched on).
OPT_IN = frozenset({"hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input"})


@dataclasses.dataclass(frozen=True)
class HookState:
    """What the hooks do during one trace: names to record (None: all but :data:`OPT_IN`,
    and those too with ``every``) and edits by name."""

    capture: frozenset[str] | None = frozenset()
    edits: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
    every: bool = False

    def wants(self, name: str) -> bool:
        if name in self.edits:
            return True
        if self.capture is None:
            return self.every or name.rsplit(".", 1)[-1] not in OPT_IN
        return name in self.capture


_STATE: contextvars.ContextVar[HookState | None] = contextvars.ContextVar(
    "tfmjax_hooks", default=None
)


@contextlib.contextmanager
def hooks_active(capture=None, edits: Mapping[str, Callable] | None = None, every=False):
    """Turn the hooks on while tracing: record ``capture`` (names; None = every hook but the
    :data:`OPT_IN` ones, those too with ``every``) and apply ``edits`` (``{name: x -> x}``)."""
    capture = None if capture is None else frozenset(capture)
    state = HookState(capture, dict(edits or {}), every)
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


def active() -> bool:
    """Whether hooks are on in this trace (inside :func:`hooks_active`)."""
    return _STATE.get() is not None


def _head_stack(module) -> str:
    """The ``head_stack`` of the output head enclosing ``module`` (``decoder`` by default)."""
    while isinstance(module, nn.Module):
        stack = getattr(module, "head_stack", None)
        if stack:
            return stack
        module = module.parent
    return "decoder"


def full_name(module: nn.Module, name: str) -> str:
    """``name`` prefixed with the module's place: ``decoder.blocks.0.attn.`` + ``hook_q``."""
    parts = []
    for part in module.scope.path:
        layer = _LAYER.match(part)
        if part == "head":
            parts.append(_head_stack(module))
        elif layer:
            parts.append(f"blocks.{layer.group(1)}")
        elif part in _RENAME:
            if _RENAME[part]:
                parts.append(_RENAME[part])
        else:
            parts.append(part)
    return ".".join([*parts, name])


def wanted(module: nn.Module, name: str) -> bool:
    """Whether hook ``name`` of ``module`` is recorded or edited in this trace (for
    activations that cost extra to form, such as attention patterns)."""
    state = _STATE.get()
    return state is not None and state.wants(full_name(module, name))


def edited(module: nn.Module, name: str) -> bool:
    """Whether hook ``name`` of ``module`` has an edit in this trace."""
    state = _STATE.get()
    return state is not None and full_name(module, name) in state.edits


def hook(module: nn.Module, name: str, x):
    """The hook point ``name`` of ``module`` on activation ``x``: returns ``x`` (edited when an
    edit is registered), recording it when asked."""
    state = _STATE.get()
    if state is None:
        return x
    full = full_name(module, name)
    if not state.wants(full):
        return x
    if full in state.edits:
        x = state.edits[full](x)
    if module.is_mutable_collection(COLLECTION):
        module.sow(COLLECTION, full, x, reduce_fn=lambda _, new: new, init_fn=lambda: None)
    return x
