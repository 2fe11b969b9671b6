"""The decoding KV cache: a plain pytree the generation loop carries.

A model family builds it (``model.init_cache``) and updates it (``model.prefill``,
``model.decode_step``); :mod:`tfmjax.decode` carries it through the loop and beam search.

Layout (``L`` decoder layers, ``B`` rows, ``S`` slots, ``K`` key/value heads, ``H`` head width):

* ``layers``: a tuple of ``L`` per-layer caches, the form the model's unrolled layer stack
  updates in place (a stacked ``[L, ...]`` cache would be sliced and re-stacked, i.e.
  copied whole, every step). Decoder-only layer: ``{"k", "v": [B,K,S,H],
  "segment_ids": [B,S], "index": []}`` (see :func:`tfmjax.layers.attention.init_cache`).
  Encoder-decoder layer: ``{"self": <that>, "cross": {"k", "v": [B,S_enc,K,H]}}``;
  ``"cross"`` appears after the first decoder call, which projects the encoder output once.
* ``lengths [B]``: real tokens cached per row (prompt incl. BOS, then one per step); it is
  also the absolute position of the row's next token.
* ``encoded [B,S_enc,D]``, ``encoded_segment_ids [B,S_enc]``: encoder output (encoder-decoder
  only; None for decoder-only), computed once at prefill.

Keys and values are head-major (``K`` before ``S``): the attention matmuls then read them in
place instead of transposing every layer's cache at every step (see
:mod:`tfmjax.layers.attention`). Only the ``K`` key/value heads are stored, so GQA/MQA shrink
the cache by ``N/K``. Slots are preallocated; a slot with segment id 0 (left padding, or not
yet written) is never attended.
Sliding-window models keep every slot and mask by distance (no ring buffer).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def _self_attention(layer: dict) -> dict:
    return layer["self"] if "self" in layer else layer


def _map_rows(layer: dict, fn, everything: bool) -> dict:
    """``fn(array)`` on a layer's per-row arrays (self-attention only unless ``everything``)."""
    rows = lambda d: {k: (v if k == "index" else fn(v)) for k, v in d.items()}
    if "self" not in layer:
        return rows(layer)
    out = dict(layer, self=rows(layer["self"]))
    if everything and "cross" in layer:
        out["cross"] = rows(layer["cross"])
    return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Decoding state of every decoder layer; see the module docstring for shapes."""

    layers: tuple
    lengths: jax.Array
    encoded: jax.Array | None = None
    encoded_segment_ids: jax.Array | None = None
    digit_run: jax.Array | None = None  # [B] abacus place of the last token fed (else None)

    @property
    def self_attention(self) -> tuple:
        """Per-layer self-attention caches ``{"k", "v", "segment_ids", "index"}``."""
        return tuple(_self_attention(layer) for layer in self.layers)

    @property
    def capacity(self) -> int:
        """Preallocated slots ``S`` per row (0 for the constant-size states of linear
        attention, retention and the selective scan)."""
        first = self.self_attention[0]
        return first["k"].shape[2] if "k" in first else 0

    @property
    def index(self):
        """Next slot to write (the same for every row: prompts are left-padded)."""
        return self.self_attention[0]["index"]

    @property
    def kv_bytes(self) -> int:
        """Bytes of the self-attention keys and values (or MLA latents, or the recurrent state
        of linear attention, retention or the selective scan): every array but segment ids
        and indices, what ``model.kv_cache_bytes`` counts."""
        return int(
            sum(
                a.nbytes
                for sa in self.self_attention
                for name, a in sa.items()
                if name not in ("segment_ids", "index")
            )
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pytree (keys, values, segment ids, lengths, cross K/V, encoder)."""
        return int(sum(leaf.nbytes for leaf in jax.tree.leaves(self)))

    def reorder(self, rows) -> KVCache:
        """Row ``i`` of the result is row ``rows[i]`` (beam search: follow each beam's parent).

        Only the self-attention part moves: beams only ever take parents of their own batch
        item, whose encoder output and cross K/V are the same.
        """
        take = lambda a: jnp.take(a, rows, axis=0)
        layers = tuple(_map_rows(layer, take, False) for layer in self.layers)
        runs = None if self.digit_run is None else take(self.digit_run)
        return dataclasses.replace(self, layers=layers, lengths=take(self.lengths), digit_run=runs)

    def repeat(self, n: int) -> KVCache:
        """Each row repeated ``n`` times, consecutively (``[B] -> [B*n]``)."""
        rep = lambda a: None if a is None else jnp.repeat(a, n, axis=0)
        return KVCache(
            layers=tuple(_map_rows(layer, rep, True) for layer in self.layers),
            lengths=rep(self.lengths),
            encoded=rep(self.encoded),
            encoded_segment_ids=rep(self.encoded_segment_ids),
            digit_run=rep(self.digit_run),
        )
