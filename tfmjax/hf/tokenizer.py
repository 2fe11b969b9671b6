"""The tokenizer beside an HF model: read on import, written back on export.

``read(directory)`` gives the :class:`~tfmjax.data.tokenizers.HFTokenizer` of
``directory/tokenizer.json`` (None when there is none), its BOS, EOS and pad ids taken from
the first of ``tokenizer_config.json``, ``special_tokens_map.json``, ``generation_config.json``
and ``config.json`` that names them. ``write(tokenizer, directory)`` writes ``tokenizer.json``
and the other tokenizer files back, so ``transformers.AutoTokenizer.from_pretrained`` loads
them; a ``tokenizer_config.json`` is made when the import had none.
"""

from __future__ import annotations

import json
from pathlib import Path

from tfmjax.data.tokenizers import HFTokenizer
from tfmjax.hf.errors import HFError

TOKENIZER = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # token names
ID_FILES = ("generation_config.json", "config.json")  # token ids
SPECIAL = ("bos", "eos", "pad")


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HFError(f"{path} is not valid JSON: {err}") from None
    return data if isinstance(data, dict) else {}


def _content(token) -> str | None:
    """A special token as these files write it: a string or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def _first_id(value):
    """``eos_token_id`` may be a list (several stop ids): its first."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def special_ids(directory: Path, tokenizer) -> dict[str, int | None]:
    """``{"bos_id", "eos_id", "pad_id"}``: named by token in the tokenizer files, else by id
    in ``generation_config.json`` / ``config.json``; None where no file names one."""
    named = [_json(directory / name) for name in CONFIG_FILES]
    by_id = [_json(directory / name) for name in ID_FILES]
    out = {}
    for kind in SPECIAL:
        found = None
        for data in named:
            content = _content(data.get(f"{kind}_token"))
            if content is not None:
                found = tokenizer.token_to_id(content)
                if found is None:
                    raise HFError(
                        f"{directory}: {kind}_token {content!r} is not in {TOKENIZER}; fix the "
                        "tokenizer files or remove them to import without a tokenizer"
                    )
                break
        for data in by_id if found is None else ():
            found = _first_id(data.get(f"{kind}_token_id"))
            if found is not None:
                break
        out[f"{kind}_id"] = found
    return out


def read(directory: str | Path) -> HFTokenizer | None:
    """The tokenizer saved beside the model in ``directory`` (None without ``tokenizer.json``)."""
    directory = Path(directory)
    path = directory / TOKENIZER
    if not path.is_file():
        return None
    text = path.read_text()
    try:
        tokenizer = HFTokenizer(text)
    except Exception as err:  # tokenizers raises a bare Exception
        raise HFError(f"{path} is not a tokenizer the tokenizers package reads: {err}") from None
    files = {n: (directory / n).read_text() for n in CONFIG_FILES if (directory / n).is_file()}
    for name, value in special_ids(directory, tokenizer).items():
        setattr(tokenizer, name, value)
    tokenizer.files = files
    return tokenizer


def default_config(tokenizer: HFTokenizer) -> dict:
    """A ``tokenizer_config.json`` naming the special tokens, for an import that had none."""
    out = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for kind in SPECIAL:
        i = getattr(tokenizer, f"{kind}_id")
        token = tokenizer.id_to_token(i) if i is not None else None
        if token is not None:
            out[f"{kind}_token"] = token
    return out


def write(tokenizer: HFTokenizer, directory: str | Path) -> list[Path]:
    """Write ``tokenizer.json`` and the tokenizer config files to ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = dict(tokenizer.files)
    if "tokenizer_config.json" not in files:
        files["tokenizer_config.json"] = json.dumps(default_config(tokenizer), indent=2) + "\n"
    files[TOKENIZER] = tokenizer.serialized
    written = []
    for name, text in sorted(files.items()):
        (directory / name).write_text(text)
        written.append(directory / name)
    return written
