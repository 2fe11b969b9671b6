"""The README's Python cells run as written, and answer what the command lines answer.

The cells of each README section that holds runnable ones (:data:`RUNNABLE`) run in order in
one namespace (a notebook's cells), in a fresh directory that holds a link to ``configs/``;
every other python cell is a sketch over names its text defines (the interp section's
``model``, ``batch``, ``correct_ids``) and is only compiled. The checkpoint the cells trained
is then read by the command lines' own code: ``tfmjax.evaluate`` must give ``eval.py``'s
metrics and ``tfmjax.generate_text`` the answer ``python -m tfmjax.generate`` prints.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

import tfmjax

ROOT = Path(__file__).resolve().parents[1]
CELL = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HEADING = re.compile(r"^#{2,3} (.+)$", re.M)
RUNNABLE = ("Python API", "As a library")


def readme_sections() -> dict[str, list[str]]:
    """``{heading: its python cells}`` for each README section (## or ###) that has some."""
    text = (ROOT / "README.md").read_text()
    starts = [(m.start(), m.group(1)) for m in HEADING.finditer(text)] + [(len(text), "")]
    sections = {}
    for (begin, title), (end, _) in zip(starts, starts[1:], strict=False):
        cells = CELL.findall(text[begin:end])
        if cells:
            sections[title] = cells
    return sections


def run_cells(title: str, cells: list[str]) -> dict:
    """Run one section's cells in order in one namespace (a notebook's); returns it."""
    namespace: dict = {"__name__": "__readme__"}
    for i, cell in enumerate(cells, 1):
        try:
            exec(compile(cell, f"README {title}, cell {i}", "exec"), namespace)  # noqa: S102
        except Exception as err:  # noqa: BLE001  (name the cell, then fail)
            pytest.fail(f"README {title!r} python cell {i}: {type(err).__name__}: {err}\n{cell}")
    return namespace


def test_readme_python_cells_run_and_agree_with_the_command_lines(tmp_path, monkeypatch, capsys):
    from tfmjax.evaluation.report import evaluate_checkpoint
    from tfmjax.generate import main as generate_main

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    sections = readme_sections()
    for title, cells in sections.items():
        for i, cell in enumerate(cells, 1):
            compile(cell, f"README {title}, cell {i}", "exec")  # a SyntaxError names it
    assert set(RUNNABLE) <= set(sections)
    ns = {title: run_cells(title, sections[title]) for title in RUNNABLE}["Python API"]

    exp, result, m = ns["exp"], ns["result"], ns["m"]
    assert result == {**result, "step": exp.train.steps, "stopped": False}
    assert m.step == exp.train.steps and m.config.to_dict() == exp.to_dict()
    assert ns["mine"].workdir == "runs/mine" and ns["mine"].model.family == "decoder_only"
    assert (ns["model"], ns["params"], ns["tokenizer"]) == (m.model, m.params, m.tokenizer)

    # evaluate(m) is eval.py's evaluation of the same params
    cli = evaluate_checkpoint("runs/notebook")
    report = ns["report"]
    assert report["step"] == cli["step"] == m.step
    for key in cli["metric_names"]:
        assert math.isclose(report[key], cli[key], rel_tol=1e-6), key
    assert report["examples"] == cli["examples"]

    # generate_text(m, ...) is `python -m tfmjax.generate WORKDIR --input ...`
    capsys.readouterr()
    assert generate_main(["runs/notebook", "--input", "c a b"]) == 0
    assert capsys.readouterr().out.strip() == f"c a b -> {ns['answer']}"
    (row,) = ns["ids"]  # beam search: ids in the vocabulary, EOS last if it came
    assert all(isinstance(i, int) and 0 <= i < m.config.model.vocab_size for i in row)
    assert ns["answer"] == tfmjax.generate_text(m, ["c a b"])[0]
