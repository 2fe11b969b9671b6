"""What differs between two experiments, field by field."""

from __future__ import annotations

from tfmjax.config.sections import SECTIONS, Experiment


def changes(a: Experiment | dict, b: Experiment | dict, sections=tuple(SECTIONS)) -> list:
    """``(key, value in a, value in b)`` for every field that differs, nested keys flattened
    (``data.task_params.max_len``); a key present on one side only has ``<missing>``."""
    a = a.to_dict() if isinstance(a, Experiment) else a
    b = b.to_dict() if isinstance(b, Experiment) else b
    out = []
    for section in sections:
        fa, fb = _flatten(a.get(section, {}), section), _flatten(b.get(section, {}), section)
        for key in sorted(set(fa) | set(fb)):
            va, vb = fa.get(key, _MISSING), fb.get(key, _MISSING)
            if va != vb:
                out.append((key, va, vb))
    return out


def diff(
    a: Experiment | dict,
    b: Experiment | dict,
    sections=("model",),
    labels: tuple[str, str] | None = None,
) -> list[str]:
    """Readable ``section.key: a != b`` lines for the fields that differ (see :func:`changes`).

    ``labels=("checkpoint", "now")`` names the sides: ``model.d_model: 64 (checkpoint) != 128
    (now)``.
    """
    left, right = (f" ({labels[0]})", f" ({labels[1]})") if labels else ("", "")
    return [f"{key}: {va!r}{left} != {vb!r}{right}" for key, va, vb in changes(a, b, sections)]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _flatten(tree, prefix: str) -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}.{key}"))
    return out
