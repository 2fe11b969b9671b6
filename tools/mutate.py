"""Mutation testing of the math modules with cosmic-ray (`make mutate`).

Each target in ``[tool.mutation]`` of ``pyproject.toml`` names one module and
the fast tests that should kill its mutants. For every target this script

1. copies the tracked tree into ``.mutation/<target>/tree`` (mutants are
   written to disk, so they never touch your checkout, and two targets can run
   side by side without seeing each other's mutants);
2. starts a cosmic-ray session there (again only when the module changed;
   when only its tests changed, the survivors are judged again), and skips
   the mutants whose operator is not in the kept list;
3. runs the pending mutants, each in a fresh ``python -m pytest -x`` process.

Sessions persist, so an interrupted run picks up where it stopped. At the end
it prints the score per module and every surviving mutant; mutants we judged
equivalent are listed in ``docs/mutation.md`` and counted apart.

Why cosmic-ray and not mutmut: mutmut 3 forks its warmed-up test process for
each mutant, and a forked JAX process deadlocks on its first compile (XLA's
thread pools do not survive ``fork``). cosmic-ray starts a new process per
mutant, which costs a JAX import each but always finishes.

    python tools/mutate.py [--jobs 2] [--only masks,norms] [--report] [--fresh]
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
EQUIVALENTS = ROOT / "docs" / "mutation.md"


def load_settings():
    """The ``[tool.mutation]`` table: timeout, excluded operators and targets."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["mutation"]


def fingerprint(paths) -> str:
    """Hash of the files at ``paths`` (relative to the checkout)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.encode())
        digest.update((ROOT / path).read_bytes())
    return digest.hexdigest()[:16]


def copy_tree(destination: Path):
    """Copy the files git knows about (tracked or not ignored) into ``destination``."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    if destination.exists():
        shutil.rmtree(destination)
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def cosmic_ray_config(settings, target) -> str:
    """The cosmic-ray TOML for one target (cosmic-ray reads a top-level table)."""
    tests = " ".join(target["tests"])
    pytest = f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:xdist"
    command = f"{pytest} -m 'not slow' {tests}"
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(target['module'])}\n"
        f"timeout = {float(settings['timeout'])}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def skip_unlisted_operators(session: Path, operators):
    """Mark as skipped every mutant that ``not_kept`` rules out."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    kept = kept_operators(operators)
    skipped = WorkResult(output="operator not kept", worker_outcome=WorkerOutcome.SKIPPED)
    directory = session.parent
    with use_db(str(session)) as db:
        for item in list(db.pending_work_items):
            mutations = [
                (m.operator_name, m.occurrence, m.module_path, m.start_pos) for m in item.mutations
            ]
            if any(not_kept(directory, kept, *mutation) for mutation in mutations):
                db.set_result(item.job_id, skipped)


def kept_operators(operators) -> re.Pattern:
    return re.compile("|".join(f"(?:{pattern})" for pattern in operators))


def not_kept(directory: Path, kept: re.Pattern, operator, occurrence, module, start) -> bool:
    """Whether a mutation is left out: an operator not in ``kept``; NumberReplacer's
    ``n - 1`` twin (its odd occurrences: we keep ``n + 1``, which halves the count); a
    ``|`` in a type annotation (never evaluated: every module has ``from __future__ import
    annotations``); the bare ``*`` of ``def f(a, *, b)``, which cosmic-ray takes for a product.
    """
    if not kept.fullmatch(operator):
        return True
    if operator == "core/NumberReplacer" and occurrence % 2 == 1:
        return True
    line, column = start
    path = original(directory, module)
    if any(
        (a.lineno, a.col_offset) <= (line, column) < (a.end_lineno, a.end_col_offset)
        for a in annotations(path)
    ):
        return True
    if operator.startswith("core/ReplaceBinaryOperator_Mul"):
        text = source_lines(path)[line - 1]
        return text[column : column + 1] == "*" and text[column + 1 :].lstrip()[:1] in (",", ")")
    return False


def original(directory: Path, module: str) -> Path:
    """The unmutated module of a session (the tree's copy holds a mutant while one runs)."""
    saved = directory / "original" / module
    return saved if saved.exists() else ROOT / module


@functools.cache
def source_lines(path: Path) -> list[str]:
    """The lines of an unmutated module, read once."""
    return path.read_text().splitlines()


@functools.cache
def annotations(path: Path) -> list[ast.expr]:
    """Every annotation node of the module at ``path``."""
    found = []
    for node in ast.walk(ast.parse("\n".join(source_lines(path)))):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            found.append(node.returns)
    return found


def tool(name: str) -> str:
    """A cosmic-ray command from the same environment as this Python."""
    return str(Path(sys.executable).parent / name)


def prepare(settings, name, target, fresh=False) -> Path:
    """Create, refresh or keep the session for ``target``; returns its directory.

    A changed module (or ``fresh``) starts a new session. Changed tests only
    recopy the tree and send the survivors back to the queue: a killed mutant
    stays killed, which holds as long as tests are added or tightened, not
    loosened (``--fresh`` rejudges everything).
    """
    directory = WORK / name
    module_hash, tests_hash = fingerprint([target["module"]]), fingerprint(target["tests"])
    stamp = directory / "fingerprint.json"
    saved = json.loads(stamp.read_text()) if stamp.exists() else {}
    tree = directory / "tree"
    if fresh or saved.get("module") != module_hash:
        if directory.exists():
            shutil.rmtree(directory)
        copy_tree(tree)
        (directory / "original" / target["module"]).parent.mkdir(parents=True)
        shutil.copy2(tree / target["module"], directory / "original" / target["module"])
        (directory / "config.toml").write_text(cosmic_ray_config(settings, target))
        subprocess.run(
            [tool("cosmic-ray"), "init", "../config.toml", "../session.sqlite"],
            cwd=tree,
            check=True,
            capture_output=True,
        )
        skip_unlisted_operators(directory / "session.sqlite", settings["operators"])
    elif saved.get("tests") != tests_hash:
        copy_tree(tree)
        requeue_survivors(directory / "session.sqlite")
    stamp.write_text(json.dumps(dict(module=module_hash, tests=tests_hash)))
    return directory


def requeue_survivors(session: Path):
    """Drop the results of surviving mutants so that ``exec`` runs them again."""
    from cosmic_ray.work_db import WorkResultStorage, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with use_db(str(session)) as db, db._session_maker.begin() as rows:
        rows.query(WorkResultStorage).filter(
            WorkResultStorage.test_outcome == TestOutcome.SURVIVED,
            WorkResultStorage.worker_outcome == WorkerOutcome.NORMAL,
        ).delete()


def execute(directory: Path) -> float:
    """Run the session's pending mutants; returns the wall time in seconds.

    The target's own JAX persistent compilation cache lets each mutant's test
    process reuse every compiled program the mutant did not change (its key is
    the program itself), which cuts a kernel test file from ~30 s to ~7 s.
    """
    start = time.monotonic()
    cache = dict(
        JAX_COMPILATION_CACHE_DIR=str(directory / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        # the tests marked slow in their files stay out; those only listed in
        # tests/slow_tests.txt (measured slow, kept out of make test-fast) run here
        TFMJAX_SLOW_LIST="off",
    )
    subprocess.run(
        [tool("cosmic-ray"), "exec", "../config.toml", "../session.sqlite"],
        cwd=directory / "tree",
        env={**os.environ, **cache},
        check=True,
        capture_output=True,
    )
    return time.monotonic() - start


def results(directory: Path):
    """(job, result) pairs from ``cosmic-ray dump``, one JSON list per line."""
    dump = subprocess.run(
        [tool("cosmic-ray"), "dump", "../session.sqlite"],
        cwd=directory / "tree",
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [json.loads(line) for line in dump.splitlines() if line.strip()]


def equivalents():
    """``(module, code, operator)`` rows of the equivalent-mutant table in the docs.

    Rows name the mutated line by its text (stripped), not its number, so an
    edit elsewhere in the module does not unlist them.
    """
    rows = set()
    if EQUIVALENTS.exists():
        cell = r"\s*`([^`]+)`\s*"
        pattern = re.compile(rf"^\|{cell}\|{cell}\|{cell}\|")
        for line in EQUIVALENTS.read_text().splitlines():
            match = pattern.match(line)
            if match:
                code = match[2].replace("\\|", "|")  # a table cell escapes its pipes
                rows.add((match[1], code, match[3].removeprefix("core/")))
    return rows


def describe(directory: Path, job) -> tuple[str, int, str, str]:
    """(module, 1-based line, line text, operator) of a work item's single mutation."""
    mutation = job["mutations"][0]
    module, line = mutation["module_path"], mutation["start_pos"][0]
    text = source_lines(original(directory, module))[line - 1].strip()
    return module, line, text, mutation["operator_name"].removeprefix("core/")


def summarise(directory, known, kept):
    """Counts for one target and its survivors not judged equivalent.

    The filter is applied again here, so sessions started under an older filter
    are scored like new ones.
    """
    counts = dict(killed=0, survived=0, equivalent=0, skipped=0, pending=0)
    survivors = []
    for job, result in results(directory):
        mutation = job["mutations"][0]
        where = [mutation[key] for key in ("operator_name", "occurrence", "module_path")]
        if not_kept(directory, kept, *where, tuple(mutation["start_pos"])):
            counts["skipped"] += 1
        elif result is None:
            counts["pending"] += 1
        elif result["worker_outcome"] == "skipped":
            counts["skipped"] += 1
        elif result["test_outcome"] == "survived" and result["worker_outcome"] == "normal":
            module, line, text, operator = describe(directory, job)
            if (module, text, operator) in known:
                counts["equivalent"] += 1
            else:
                counts["survived"] += 1
                survivors.append(f"{module}:{line} {operator}: {text}")
        else:
            counts["killed"] += 1  # failed tests, a timeout or a crash all count
    return counts, survivors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="targets run side by side")
    parser.add_argument("--only", default="", help="comma-separated target names")
    parser.add_argument("--report", action="store_true", help="print the scores, run nothing")
    parser.add_argument("--fresh", action="store_true", help="new sessions: rejudge every mutant")
    args = parser.parse_args(argv)

    settings = load_settings()
    targets = settings["targets"]
    chosen = [n for n in args.only.split(",") if n] or list(targets)
    unknown = sorted(set(chosen) - set(targets))
    if unknown:
        parser.error(f"unknown target(s) {unknown}; known: {', '.join(targets)}")

    if not args.report:
        directories = {name: prepare(settings, name, targets[name], args.fresh) for name in chosen}
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(execute, directories[n]): n for n in chosen}
            for future in concurrent.futures.as_completed(futures):
                print(f"{futures[future]}: ran in {future.result():.0f} s", flush=True)

    known = equivalents()
    kept = kept_operators(settings["operators"])
    print("\n| module | mutants | killed | survived | equivalent | score |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    all_survivors = []
    for name in chosen:
        directory = WORK / name
        if not (directory / "session.sqlite").exists():
            print(f"| {name} | not run | | | | |")
            continue
        counts, survivors = summarise(directory, known, kept)
        all_survivors += survivors
        judged = counts["killed"] + counts["survived"]
        score = f"{counts['killed'] / judged:.1%}" if judged else "-"
        pending = f" ({counts['pending']} pending)" if counts["pending"] else ""
        total = judged + counts["equivalent"]
        print(
            f"| {targets[name]['module']} | {total}{pending} | {counts['killed']} "
            f"| {counts['survived']} | {counts['equivalent']} | {score} |"
        )
    if all_survivors:
        print(f"\n{len(all_survivors)} surviving mutants (kill them, or list them in docs):")
        print("\n".join(f"  {survivor}" for survivor in all_survivors))
    return 1 if all_survivors else 0


if __name__ == "__main__":
    sys.exit(main())
