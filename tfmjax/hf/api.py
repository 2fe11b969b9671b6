"""``load(directory) -> (ModelConfig, params)`` and ``save(config, params, directory)``.

``directory`` holds ``config.json`` and ``model.safetensors`` (what ``save_pretrained``
writes), and maybe ``generation_config.json``, whose ``eos_token_id`` wins over config.json's.
Token ids come from the checkpoint: ``model.pad_id`` is ``pad_token_id`` (None where the model
has none, as GPT-2 and Llama, or where it is also the BOS or an EOS: padding then comes from
explicit lengths or segment ids),
``model.eos_id`` the (first) ``eos_token_id``, and an imported model continues exactly the
ids it is given (``model.prompt_bos = false``), as transformers does.

Params are ``{"params": ...}`` as ``model.init`` returns them, float32, layers
stacked when ``model.scan_layers`` (the default).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp

import tfmjax.hf.bart as bart
import tfmjax.hf.bert as bert
import tfmjax.hf.gpt2 as gpt2
import tfmjax.hf.llama as llama
import tfmjax.hf.t5 as t5
import tfmjax.hf.tensors as tensors
from tfmjax.config import ConfigError, ModelConfig
from tfmjax.hf.arch import Architecture
from tfmjax.hf.errors import HFError
from tfmjax.hf.fields import Fields
from tfmjax.hf.mapping import export_params, flatten, import_params, unflatten
from tfmjax.models import build

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a for a in (gpt2.ARCH, llama.ARCH, bert.ARCH, bart.BART, bart.MARIAN, t5.ARCH)
}
# Settings of how tfmjax runs a model, not of the function it computes: export ignores them.
RUNTIME_FIELDS = ("dropout_rate", "attention_impl", "scan_layers", "remat", "dtype")
# Token ids and prompt layout: written as config.json's token ids, not part of the function.
TOKEN_FIELDS = ("pad_id", "eos_id", "prompt_bos")


def read_config(directory: str | Path) -> dict:
    """The ``config.json`` of an HF directory as a dict."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise HFError(f"{path} does not exist: pass a directory written by save_pretrained")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HFError(f"{path} is not valid JSON: {err}") from None


def read_generation_config(directory: str | Path) -> dict:
    """The ``generation_config.json`` of an HF directory as a dict ({} when absent)."""
    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HFError(f"{path} is not valid JSON: {err}") from None


def architecture_of(raw: dict) -> Architecture:
    """The architecture of an HF config dict, by its ``model_type``."""
    kind = raw.get("model_type")
    for arch in ARCHITECTURES.values():
        if kind in arch.model_types:
            return arch
    known = ", ".join(t for a in ARCHITECTURES.values() for t in a.model_types)
    raise HFError(f"config.json model_type={kind!r} is not supported; tfmjax reads {known}")


def config_from_hf(raw: dict, **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of an HF config dict; an unsupported field is refused."""
    arch = architecture_of(raw)
    fields = Fields(raw, arch.name)
    for name in ("attn_implementation", "_attn_implementation"):  # same math in all of these
        fields.expect(name, (None, "eager", "sdpa"))
    try:
        cfg = arch.config_from_hf(fields)
        cfg = dataclasses.replace(
            cfg,
            pad_id=padding_id(fields, raw, cfg.vocab_size),
            eos_id=fields.token_id("eos_token_id", cfg.vocab_size, None),
            prompt_bos=False,
        )
    except ConfigError as err:
        raise HFError(f"config.json maps to an invalid tfmjax config: {err}") from None
    fields.finish()
    return dataclasses.replace(cfg, **overrides)


def padding_id(fields: Fields, raw: dict, vocab_size: int) -> int | None:
    """``model.pad_id`` of a checkpoint: its ``pad_token_id``, but None when that id is also
    its BOS or an EOS (the usual ``pad_token_id = eos_token_id`` of a fine-tuned GPT-2 or
    Llama). Such an id is a token in text (a document separator, the BOS a prompt starts
    with) that transformers attends to, as its attention mask comes from lengths, not ids;
    read as padding, it would be masked out of every row that holds it."""
    pad = fields.token_id("pad_token_id", vocab_size, None)
    eos = raw.get("eos_token_id")
    text_ids = {raw.get("bos_token_id"), *(eos if isinstance(eos, list) else [eos])}
    return None if pad in text_ids else pad


def abstract_params(cfg: ModelConfig) -> dict:
    """``{path: ShapeDtypeStruct}`` of the params of ``cfg`` (no memory: ``jax.eval_shape``)."""
    model = build(cfg)
    batch = model.dummy_batch(1, min(8, cfg.max_len))
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch)
    return flatten(shapes["params"])


def _with_prefix(found: dict, prefix: str) -> dict:
    """A bare base-model state dict (no ``transformer.`` / ``model.`` prefix) gets it."""
    if any(name.startswith(prefix) for name in found):
        return found
    return {prefix + name: array for name, array in found.items()}


def load(directory: str | Path, **overrides) -> tuple[ModelConfig, dict]:
    """``(ModelConfig, params)`` of an HF directory; ``overrides`` replace config fields that
    do not change the function (``scan_layers=False``, ``attention_impl=...``)."""
    raw = read_config(directory)
    eos = read_generation_config(directory).get("eos_token_id")
    if eos is not None:
        raw["eos_token_id"] = eos
    cfg, arch = config_from_hf(raw, **overrides), architecture_of(raw)
    found = _with_prefix(tensors.read(directory), arch.prefix)
    flat = import_params(found, arch.mapping(cfg), abstract_params(cfg))
    return cfg, {"params": unflatten({p: jnp.asarray(a) for p, a in flat.items()})}


def _diff(cfg: ModelConfig, back: ModelConfig) -> list[str]:
    return [
        f"model.{f.name}={getattr(cfg, f.name)!r} (it needs {getattr(back, f.name)!r})"
        for f in dataclasses.fields(cfg)
        if f.name not in RUNTIME_FIELDS + TOKEN_FIELDS
        and getattr(cfg, f.name) != getattr(back, f.name)
    ]


def _mismatches(cfg: ModelConfig, arch: Architecture) -> list[str]:
    """Config fields the HF ``arch`` cannot express (empty: exportable)."""
    try:
        back = arch.config_from_hf(Fields(arch.config_to_hf(cfg), arch.name))
    except (HFError, ConfigError) as err:
        return [str(err)]
    return _diff(cfg, back)


def architecture_for(cfg: ModelConfig, name: str | None = None) -> Architecture:
    """The HF architecture that computes exactly what ``cfg`` does (``name``: that one)."""
    if cfg.moe_experts:
        raise HFError(
            f"model.moe_experts={cfg.moe_experts}: no Hugging Face architecture tfmjax maps "
            "holds a mixture of experts; only dense models export"
        )
    if name is not None and name not in ARCHITECTURES:
        raise HFError(f"architecture {name!r} is not one of {', '.join(ARCHITECTURES)}")
    candidates = [ARCHITECTURES[name]] if name else list(ARCHITECTURES.values())
    found = {arch.name: _mismatches(cfg, arch) for arch in candidates}
    for arch in candidates:
        if not found[arch.name]:
            return arch
    best = min(found, key=lambda n: len(found[n]))
    raise HFError(f"cannot export as {best}: {'; '.join(found[best])}")


def hf_config(cfg: ModelConfig, arch: Architecture, dtype: str, extra: dict | None) -> dict:
    """The ``config.json`` of an export: the architecture's fields, then ``extra``."""
    out = {"architectures": [arch.hf_class], **arch.config_to_hf(cfg), "dtype": dtype}
    out.update(pad_token_id=cfg.pad_id, eos_token_id=cfg.eos_id)  # the model's, unless extra
    out.update({k: v for k, v in (extra or {}).items() if k not in out or k.endswith("_id")})
    return dict(sorted(out.items()))


def _check_shapes(flat: dict, abstract: dict) -> None:
    """The params are those of the config: same paths, same shapes (one line if not)."""
    for path in sorted(set(flat) | set(abstract)):
        got = tuple(flat[path].shape) if path in flat else None
        want = tuple(abstract[path].shape) if path in abstract else None
        if got != want:
            raise HFError(f"params do not fit the config: {path} is {got}, the config needs {want}")


def save(
    config: ModelConfig,
    params: dict,
    directory: str | Path,
    *,
    arch: str | None = None,
    dtype: str = "float32",
    extra: dict | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` that ``from_pretrained`` loads.

    ``dtype``: the tensors' dtype on disk. ``extra``: more ``config.json`` fields (token ids
    such as ``eos_token_id``). Returns ``directory``.
    """
    chosen = architecture_for(config, arch)
    flat = flatten(params.get("params", params))
    _check_shapes(flat, abstract_params(config))
    out = export_params(flat, chosen.mapping(config), tensors.dtype_of(dtype))
    directory = Path(directory)
    tensors.write(directory, out)
    text = json.dumps(hf_config(config, chosen, dtype, extra), indent=2, sort_keys=True)
    (directory / "config.json").write_text(text + "\n")
    return directory
