"""The one error type of the Hugging Face import and export."""

from __future__ import annotations


class HFError(ValueError):
    """A checkpoint or config tfmjax cannot read or write; the message is one line."""
