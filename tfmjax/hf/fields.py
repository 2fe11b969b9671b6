"""Reading a ``config.json``: every field is mapped, checked or explicitly ignored.

A field tfmjax cannot honour (an unknown one, ``rope_scaling``, another activation) raises
:class:`~tfmjax.hf.errors.HFError` in one line naming it; nothing is dropped silently.
"""

from __future__ import annotations

from typing import Any

from tfmjax.hf.errors import HFError

# Fields that never change the function a checkpoint computes (bookkeeping, training-only
# settings such as dropout and initialisation, generation defaults, labels).
BOOKKEEPING = (
    "architectures",
    "model_type",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "_name_or_path",
    "use_cache",
    "initializer_range",
    "initializer_factor",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "id2label",
    "label2id",
    "problem_type",
    "tokenizer_class",
    "task_specific_params",
    "finetuning_task",
    "classifier_dropout",
    "gradient_checkpointing",
    # generation defaults (what generate() does by default, not what the model computes)
    "max_length",
    "min_length",
    "num_beams",
    "early_stopping",
    "no_repeat_ngram_size",
    "length_penalty",
    "bad_words_ids",
    "num_return_sequences",
    "output_past",
    "_num_labels",
    "num_labels",
)

_MISSING = object()


class Fields:
    """``config.json`` as a dict whose fields are used one by one; :meth:`finish` refuses the
    rest. ``arch`` names the architecture in messages."""

    def __init__(self, raw: dict, arch: str):
        self.raw, self.arch, self.used = dict(raw), arch, set(BOOKKEEPING)

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """The value of ``name`` (``default`` when absent; absent without one: an error)."""
        self.used.add(name)
        if name in self.raw:
            return self.raw[name]
        if default is _MISSING:
            raise HFError(f"config.json of this {self.arch} model has no field {name!r}")
        return default

    def ignore(self, *names: str) -> None:
        """Fields read nowhere because they do not change the logits (e.g. dropout)."""
        self.used.update(names)

    def expect(self, name: str, allowed: tuple, default: Any = None) -> Any:
        """A field tfmjax supports only with one of the ``allowed`` values."""
        value = self.get(name, default)
        if value not in allowed:
            self.refuse(name, value, f"tfmjax supports only {' or '.join(map(repr, allowed))}")
        return value

    def choose(self, name: str, table: dict, default: Any = _MISSING) -> Any:
        """``table[value]`` of a field whose values map onto tfmjax settings."""
        value = self.get(name, default)
        if value not in table:
            self.refuse(name, value, f"tfmjax supports {', '.join(map(repr, table))}")
        return table[value]

    def refuse(self, name: str, value: Any, why: str) -> None:
        raise HFError(f"config.json field {name}={value!r} is not supported ({self.arch}): {why}")

    def token_id(self, name: str, vocab_size: int, default: int | None) -> int | None:
        """A token id field (``bos_token_id``, ...) inside the vocabulary, else ``default``;
        of a list (several EOS ids), the first."""
        value = self.get(name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is None:
            return default
        if not 0 <= value < vocab_size:
            self.refuse(name, value, f"not a token id of the vocabulary [0, {vocab_size})")
        return value

    def finish(self) -> None:
        """Refuse the first field nobody read."""
        for name in sorted(self.raw):
            if name not in self.used:
                self.refuse(name, self.raw[name], "tfmjax does not know this field")
