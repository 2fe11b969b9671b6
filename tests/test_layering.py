"""Imports run downward only and form no cycle (lazy imports inside functions included).

Every module under ``tfmjax/`` is parsed (never imported). A module may import modules of a
lower layer, or modules of its own top-level package; anything else is a layering error.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Layer of each top-level name under tfmjax/ (the package __init__ is ""): config < kernels,
# layers, data < models < decode, train, ... < entry points, with the order inside a group
# made explicit (layers use kernels; the training loop uses the evaluator; decoding, checkpoints
# and training all place arrays on the mesh of tfmjax.parallel).
LAYER_GROUPS = [
    ("", "presets", "field_help"),
    ("config",),
    ("kernels", "data", "losses"),
    ("layers",),
    ("models",),
    ("parallel",),
    ("decode", "checkpoint"),
    ("evaluator",),
    ("text_evaluator",),
    ("train", "interp", "hf"),
    ("evaluate", "generate", "summary", "explain"),
]
LAYERS = {name: rank for rank, names in enumerate(LAYER_GROUPS) for name in names}


def module_files(root: Path) -> dict[str, str]:
    """``{dotted module name: source}`` for every .py file of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def imports_of(name: str, source: str, modules: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for every tfmjax module ``name`` imports, at any depth of the file.

    Besides import statements, any string constant that is exactly a module's name counts (a
    lazy ``importlib.import_module(table[name])`` over a table of names), except the name
    given to ``logging.getLogger``.
    """
    found = []
    tree = ast.parse(source)
    logger_names = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger"
        for arg in node.args
    }
    package = (
        name
        if name in modules and any(m.startswith(name + ".") for m in modules)
        else name.rpartition(".")[0]
    )
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        elif (
            isinstance(node, ast.Constant)
            and node.value in modules
            and id(node) not in logger_names
        ):
            targets = [node.value]
        for target in targets:
            while target and target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name and target not in {t for _, t in found}:
                found.append((node.lineno, target))
    return found


def top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def graph(files: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    modules = set(files)
    return {name: imports_of(name, source, modules) for name, source in files.items()}


def upward_imports(edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    problems = []
    for name, targets in sorted(edges.items()):
        if top(name) not in LAYERS:
            problems.append(
                f"{name}: unknown top-level name {top(name)!r}: add it to the layer "
                "table in tests/test_layering.py"
            )
            continue
        for line, target in targets:
            a, b = top(name), top(target)
            if a == b or LAYERS.get(b, 99) < LAYERS[a]:
                continue
            problems.append(
                f"{name}:{line} imports {target} "
                f"(layer {LAYERS[a]} {a or 'tfmjax'} -> {LAYERS.get(b)} {b})"
            )
    return problems


def cycles(edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Each import cycle once, as ``a -> b -> ... -> a`` (depth-first search)."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for _, nxt in edges.get(node, []):
            if state.get(nxt) == "open":
                found.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_no_module_imports_a_higher_layer():
    problems = upward_imports(graph(module_files(ROOT / "tfmjax")))
    assert not problems, "imports that run upward:\n" + "\n".join(problems)


def test_no_import_cycles():
    found = cycles(graph(module_files(ROOT / "tfmjax")))
    assert not found, "import cycles:\n" + "\n".join(found)


def test_package_init_holds_only_the_version():
    assert graph(module_files(ROOT / "tfmjax"))["tfmjax"] == []


def test_the_checker_reports_an_upward_import_and_a_cycle():
    files = {
        "tfmjax": "",
        "tfmjax.config": "def f():\n    import tfmjax.models.x\n",
        "tfmjax.models": "",
        "tfmjax.models.x": "from tfmjax.models import y\n",
        "tfmjax.models.y": "import importlib\nimportlib.import_module('tfmjax.models.x')\n",
    }
    edges = graph(files)
    assert upward_imports(edges) == [
        "tfmjax.config:2 imports tfmjax.models.x (layer 1 config -> 4 models)"
    ]
    assert cycles(edges) == ["tfmjax.models.x -> tfmjax.models.y -> tfmjax.models.x"]
