"""Imports run downward only and form no cycle (lazy imports inside functions included);
submodules never import their own package's face; no file under ``tfmjax/`` is over
:data:`MAX_LINES` lines.

Every module under ``tfmjax/`` is parsed (never imported). A module may import modules of a
lower layer, or modules of its own top-level package; anything else is a layering error.
Importing ``p.q.m`` runs the faces ``p`` and ``p.q`` first, as Python does, so the import
graph holds those edges too and a cycle through a package face is seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500  # docs/design.md: small files, one job each

# Layer of each top-level name under tfmjax/ (the package __init__ is ""): config < kernels,
# layers, data < models < decode, train, ... < entry points, with the order inside a group
# made explicit (layers use kernels; the training loop uses the evaluator; decoding, checkpoints
# and training all place arrays on the mesh of tfmjax.parallel). A dotted name places one
# submodule apart from its package: ``config.explain`` is a CLI that lists the tasks too.
# ``compat`` (what differs between jax versions) imports only jax: anything may use it.
LAYER_GROUPS = [
    ("",),
    ("compat",),
    ("config", "reporting"),
    ("kernels", "data", "losses"),
    ("layers",),
    ("models",),
    ("parallel",),
    ("decode", "checkpoint"),
    ("evaluation",),
    ("train", "interp", "hf"),
    ("generate", "summary", "config.explain"),
    ("sweep",),
    ("api",),  # the Python API (tfmjax.experiment, fit, load, ...): a face over the rest
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
    """The layer-table name of module ``name``: its top-level package, or a submodule the
    table places apart (``tfmjax.config.explain`` -> ``config.explain``)."""
    parts = name.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in LAYERS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else ""


def faces_of(target: str, modules: set[str]) -> list[str]:
    """The package faces Python runs before ``target``: ``a.b.c`` -> ``[a, a.b]``."""
    parts = target.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules]


def graph(files: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """``{module: [(line, imported module), ...]}``, the faces run on the way included (an
    importer's own enclosing packages aside: they are running already)."""
    modules = set(files)
    edges = {}
    for name, source in files.items():
        direct = imports_of(name, source, modules)
        edges[name] = list(direct)
        seen = {t for _, t in direct}
        for line, target in direct:
            for face in faces_of(target, modules):
                if face not in seen and face != name and not name.startswith(face + "."):
                    edges[name].append((line, face))
                    seen.add(face)
    return edges


def own_face_imports(files: dict[str, str]) -> list[str]:
    """Submodules that import one of their own enclosing packages' ``__init__`` (``from
    tfmjax.hf import x`` inside ``tfmjax/hf/``): import the sibling module itself."""
    modules = set(files)
    problems = []
    for name, source in sorted(files.items()):
        for line, target in imports_of(name, source, modules):
            if name.startswith(target + ".") and target != "tfmjax":
                problems.append(f"{name}:{line} imports its own package's face {target}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                face = node.module
                named_modules = all(f"{face}.{a.name}" in modules for a in node.names)
                if name.startswith(face + ".") and face != "tfmjax" and named_modules:
                    problems.append(
                        f"{name}:{node.lineno} imports its own package's face {face} "
                        f"(write: import {face}.{node.names[0].name})"
                    )
    return problems


def long_files(root: Path) -> list[str]:
    """Files under ``root`` over :data:`MAX_LINES` lines."""
    counts = {p: len(p.read_text().splitlines()) for p in sorted(root.rglob("*.py"))}
    return [
        f"{p.relative_to(root.parent)}: {n} lines (at most {MAX_LINES}: split it at a concept)"
        for p, n in counts.items()
        if n > MAX_LINES
    ]


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


def package_graph() -> dict[str, list[tuple[int, str]]]:
    """The import graph of ``tfmjax/``, less the face's hand-on of the API: ``tfmjax``
    imports ``tfmjax.api`` only inside ``__getattr__``, on first use of one of its names,
    when ``tfmjax`` itself (``__version__``, imported by lower layers) has long been loaded;
    :func:`test_package_face_hands_on_the_api_only_lazily` checks that it stays so."""
    edges = graph(module_files(ROOT / "tfmjax"))
    edges["tfmjax"] = [(line, t) for line, t in edges["tfmjax"] if t != "tfmjax.api"]
    return edges


def test_no_module_imports_a_higher_layer():
    problems = upward_imports(package_graph())
    assert not problems, "imports that run upward:\n" + "\n".join(problems)


def test_no_import_cycles():
    found = cycles(package_graph())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_submodule_imports_its_own_package_face():
    found = own_face_imports(module_files(ROOT / "tfmjax"))
    assert not found, "imports of a package's own face:\n" + "\n".join(found)


def test_no_file_is_over_the_line_limit():
    found = long_files(ROOT / "tfmjax")
    assert not found, "files over the limit:\n" + "\n".join(found)


def test_package_face_hands_on_the_api_only_lazily():
    source = (ROOT / "tfmjax" / "__init__.py").read_text()
    assert [t for _, t in graph(module_files(ROOT / "tfmjax"))["tfmjax"]] == ["tfmjax.api"]
    top_level = [n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [alias.name for n in top_level for alias in n.names] == ["importlib"]


def test_the_checker_reports_an_upward_import_and_a_cycle():
    files = {
        "tfmjax": "",
        "tfmjax.config": "def f():\n    import tfmjax.models.x\n",
        "tfmjax.models": "",
        "tfmjax.models.x": "from tfmjax.models import y\n",
        "tfmjax.models.y": "import importlib\nimportlib.import_module('tfmjax.models.x')\n",
    }
    edges = graph(files)
    upward = f"(layer {LAYERS['config']} config -> {LAYERS['models']} models)"
    assert upward_imports(edges) == [
        f"tfmjax.config:2 imports tfmjax.models.x {upward}",
        f"tfmjax.config:2 imports tfmjax.models {upward}",  # the face runs first
    ]
    assert cycles(edges) == ["tfmjax.models.x -> tfmjax.models.y -> tfmjax.models.x"]


def test_the_checker_reports_an_own_face_import_and_a_cycle_through_a_face():
    """The two faults main had: ``from tfmjax.hf import bart`` inside ``tfmjax.hf.api``, whose
    face imports it back; and a module elsewhere importing ``tfmjax.hf.api``, whose face runs
    first."""
    files = {
        "tfmjax": "",
        "tfmjax.hf": "from tfmjax.hf.api import load\n",
        "tfmjax.hf.api": "from tfmjax.hf import bart\nfrom tfmjax.hf import load\n",
        "tfmjax.hf.bart": "from tfmjax.train.x import f\n",
        "tfmjax.train": "",
        "tfmjax.train.x": "def f():\n    from tfmjax.hf.api import load\n",
    }
    assert own_face_imports(files) == [
        "tfmjax.hf.api:2 imports its own package's face tfmjax.hf",
        "tfmjax.hf.api:1 imports its own package's face tfmjax.hf (write: import tfmjax.hf.bart)",
    ]
    assert "tfmjax.hf -> tfmjax.hf.api -> tfmjax.hf.bart -> tfmjax.train.x -> tfmjax.hf" in (
        cycles(graph(files))
    )


def test_the_checker_reports_a_long_file(tmp_path):
    package = tmp_path / "tfmjax"
    package.mkdir()
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_files(package) == [
        f"tfmjax/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES}: split it at a concept)"
    ]
