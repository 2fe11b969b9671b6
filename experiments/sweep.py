"""What the experiment sweeps share: train one config in a subprocess, store its result as a
small JSON file keyed by a hash of the full config, rerun only what is missing or stale, and
rewrite a table of ``docs/studies.md`` between markers.

A result records the last eval's metrics, the eval curve, the wall time (Python start-up,
compilation, training, evals and checkpoints: ``train.py`` from start to exit) and the load
average around the run, since the 2-core machine may be shared, and how many cores the run
was allowed (``taskset -c 0 python experiments/...`` pins a sweep to one core, leaving the
other free; these small models train about as fast on one core as on two).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tfmjax.config import load  # noqa: E402
from tfmjax.models.summary import count_params  # noqa: E402

STUDIES = ROOT / "docs" / "studies.md"
METRICS = ("exact_match", "token_accuracy", "loss", "bits_per_char")


def config_hash(config_path: str | Path, overrides: list[str]) -> str:
    """A hash of the whole experiment config (the workdir and the mesh left out)."""
    raw = load(ROOT / config_path, overrides).to_dict()
    raw["train"]["workdir"] = ""
    raw.pop("mesh", None)
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


def is_current(path: Path, config_path: str | Path, overrides: list[str]) -> bool:
    """Whether ``path`` holds a result of exactly this config."""
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("config_hash") == config_hash(config_path, overrides)


def train(config_path: str | Path, overrides: list[str], workdir: Path) -> dict:
    """``train.py CONFIG OVERRIDES`` in a fresh ``workdir``; the result record.

    A run that stops on a non-finite loss is a result (``diverged_at``), not an error.
    """
    if workdir.exists():
        shutil.rmtree(workdir)
    cmd = [sys.executable, str(ROOT / "train.py"), str(ROOT / config_path), *overrides]
    cmd.append(f"train.workdir={workdir}")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    diverged = re.search(r"non-finite loss or gradient at step (\d+)", proc.stderr)
    if proc.returncode != 0 and not diverged:
        raise RuntimeError(f"{config_path} {overrides} failed:\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("split") == "eval"]
    last = evals[-1] if evals else {"step": 0}
    return {
        "config": str(config_path),
        "overrides": overrides,
        "config_hash": config_hash(config_path, overrides),
        "params": count_params(load(ROOT / config_path, overrides).model),
        "diverged_at": int(diverged.group(1)) if diverged else None,
        "step": last["step"],
        **{k: last[k] for k in METRICS if k in last},
        "curve": [{k: r[k] for k in ("step", *METRICS) if k in r} for r in evals],
        "wall_sec": round(wall, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "cores": len(os.sched_getaffinity(0)),
        "date": time.strftime("%Y-%m-%d"),
    }


def save(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def write_table(begin: str, end: str, text: str, page: Path = STUDIES) -> None:
    """Replace what lies between the markers ``begin`` and ``end`` in ``page``."""
    content = page.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(content):
        raise SystemExit(f"{page.name} has no {begin} ... {end} block to rewrite")
    page.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", content))


def parser(doc: str, names) -> argparse.ArgumentParser:
    """The options every sweep takes: ``--only NAME`` (repeatable), ``--table``, and for
    tests ``--extra`` (an override for every run) and ``--results`` (where results go)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--only", choices=list(names), action="append", help="one of (repeatable)")
    p.add_argument(
        "--table", action="store_true", help="rewrite the study's table in docs/studies.md"
    )
    p.add_argument(
        "--extra", action="append", default=[], help="override for every run (tests only)"
    )
    p.add_argument("--results", help="results directory (tests only)")
    return p
