"""QK and OV circuits of softmax attention (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits").

Row-vector convention: activations are rows, ``q = x W_Q``. Per query head ``n`` (its key and
value weights are those of kv head ``n // (N // K)``):

  QK[n] = W_Q[n] W_K[n]ᵀ   [D,D]   attention logit (before the 1/sqrt(H) scale): x_q QK x_kᵀ
  OV[n] = W_V[n] W_O[n]    [D,D]   what a head writes for an attended row x: x OV
  full QK = W_E QK W_Eᵀ    [V,V]   full OV = W_E OV W_U   [V,V]

Copying score: Re(Σλ) / Σ|λ| over the eigenvalues λ of the full OV circuit (+1: the head
copies the attended token to the output, -1: it suppresses it). Composition score of head A
(earlier) into head B (later): ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F) with W_A = OV(A) and
W_B = QK(B) (Q-composition), QK(B)ᵀ (K-composition) or OV(B) (V-composition).

Everything stays factored through the head width ``H`` (:class:`FactoredMatrix`); nothing of
size ``D×D`` or ``V×V`` is formed unless asked for with ``.full()``. The circuits read the
projection kernels only: biases, positions (RoPE, ALiBi, ...), the MLPs and the norms are
left out (a norm's scale is not folded in), and so is a masked-LM head's transform.

Which attention variants have them (:func:`circuits_of`, from the variant class's
``qk_ov_circuits`` and ``qk_circuit``), by the stack's own variant (:func:`stack_attention`:
an encoder_decoder model's other stack and its cross-attention are softmax):

- softmax (MHA/GQA/MQA): both.
- nystrom: both. Its three kernels' logits are segment means of ``x_q QK x_kᵀ`` (the
  landmarks are means of q and k, so of x W_Q and x W_K), and each head writes
  ``M · (x W_V) W_O`` with the mixing matrix ``M = F̃ Ã⁺ B̃`` (plus the convolution over V
  with ``nystrom_conv``, also a mix of rows of ``x W_V``): what OV describes, per unit of
  mixing weight (the weights need not be positive).
- linformer: both, in the same sense as nystrom. The logit of query ``t`` at projected key
  ``r`` is ``Σ_s E[r,s] x_t QK x_sᵀ``, an ``E``-weighted sum of the QK form; each head
  writes ``(P F) (x W_V) W_O``, a mix (by ``P F``, weights of any sign) of its rows'
  ``x OV``. What mixes the rows is learned per layer (``E``, ``F``), not read off these
  circuits.
- retention: QK only. Its score is ``γ^(t-s) q_t·k_s / √H``, bilinear in the rows as
  softmax attention's logit; but each head's values reach ``W_O`` through a GroupNorm
  (a per-position, per-head rescaling) and ``swish(x W_G)``, a gate computed from the
  query's own row, so ``W_V W_O`` is not what a head writes: attention_weights gives
  ``W_Q`` and ``W_K`` only, and the OV tools (``full_ov_circuit``,
  ``composition_scores``, which read OV of the earlier head) refuse it.
- selective_scan, linear, mla: neither (no per-head queries and keys, or a feature map or
  a shared latent between them): refused in one line.

Dimension letters: B batch, T query length, S key length, D d_model, N query heads, K kv heads,
H head width, V vocab, L layers, R rank.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tfmjax.layers.attention_variants import ATTENTION_VARIANTS
from tfmjax.models.common import decoder_block_config, encoder_block_config

ATTENTION_KEYS = {"attn": "attention", "cross_attn": "cross_attention"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FactoredMatrix:
    """The matrix ``A @ B`` kept as its factors ``A [..., M, R]`` and ``B [..., R, N]``.

    Leading axes (e.g. one per head) broadcast as in ``jnp.matmul``. A pytree: it passes
    through ``jax.jit`` and ``jax.vmap``.
    """

    A: jax.Array
    B: jax.Array
    # NumPy arrays defer to __rmatmul__ (W_E @ circuit with host params), not broadcast over
    # the FactoredMatrix as an object.
    __array_ufunc__ = None

    @property
    def shape(self) -> tuple[int, ...]:
        """``(..., M, N)``."""
        batch = jnp.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return (*batch, self.A.shape[-2], self.B.shape[-1])

    @property
    def rank(self) -> int:
        """The inner width ``R`` (an upper bound of the matrix rank)."""
        return self.A.shape[-1]

    def full(self) -> jax.Array:
        """The dense matrix ``A @ B`` ``[..., M, N]``."""
        return self.A @ self.B

    @property
    def T(self) -> FactoredMatrix:
        """The transpose ``Bᵀ Aᵀ`` ``[..., N, M]``."""
        return FactoredMatrix(jnp.swapaxes(self.B, -1, -2), jnp.swapaxes(self.A, -1, -2))

    def __getitem__(self, index) -> FactoredMatrix:
        """Index the leading axes: ``ov[n]`` is head ``n``'s ``[M,N]`` matrix."""
        return FactoredMatrix(self.A[index], self.B[index])

    def __matmul__(self, other) -> FactoredMatrix:
        """``self @ other`` for an array ``[..., N, P]`` (rank stays R) or a FactoredMatrix
        (the smaller of the two inner widths is kept)."""
        if isinstance(other, FactoredMatrix):
            inner = self.B @ other.A  # [..., R1, R2]
            if self.rank <= other.rank:
                return FactoredMatrix(self.A, inner @ other.B)
            return FactoredMatrix(self.A @ inner, other.B)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other) -> FactoredMatrix:
        """``other @ self`` for an array ``[..., P, M]``."""
        return FactoredMatrix(other @ self.A, self.B)

    def frobenius_norm(self) -> jax.Array:
        """``‖AB‖_F = sqrt(trace((AᵀA)(BBᵀ)))`` from two ``[R,R]`` Gram matrices. ``[...]``."""
        ata = jnp.swapaxes(self.A, -1, -2) @ self.A
        bbt = self.B @ jnp.swapaxes(self.B, -1, -2)
        return jnp.sqrt(jnp.maximum(jnp.sum(ata * bbt, axis=(-2, -1)), 0.0))

    def eigenvalues(self) -> jax.Array:
        """Eigenvalues of ``B A`` ``[..., R]`` (complex): the nonzero eigenvalues of ``A B``
        (square ``M == N``), padded with zeros up to ``R``."""
        if self.shape[-2] != self.shape[-1]:
            raise ValueError(f"eigenvalues need a square matrix, got shape {self.shape}")
        return jnp.linalg.eig(self.B @ self.A)[0]

    def svd(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Thin SVD ``(U [..., M, R'], S [..., R'], Vh [..., R', N])`` with ``R' =
        min(M, R, N)``, from the QR factors of ``A`` and ``Bᵀ``: ``AB = Qa (Ra Rbᵀ) Qbᵀ``."""
        qa, ra = jnp.linalg.qr(self.A)
        qb, rb = jnp.linalg.qr(jnp.swapaxes(self.B, -1, -2))
        u, s, vh = jnp.linalg.svd(ra @ jnp.swapaxes(rb, -1, -2), full_matrices=False)
        return qa @ u, s, vh @ jnp.swapaxes(qb, -1, -2)


def stack_attention(model, stack: str, kind: str = "attn") -> str:
    """The ``model.attention`` variant of ``stack``'s ``kind`` layers: cross-attention is
    softmax; an encoder keeps softmax for a causal-only mixer, a decoder for a
    bidirectional-only one (:mod:`tfmjax.models.common`)."""
    if kind == "cross_attn":
        return "softmax"
    configure = encoder_block_config if stack == "encoder" else decoder_block_config
    return configure(model.config).attention


def circuits_of(variant: type) -> tuple[str, ...]:
    """The circuits that apply to an attention variant class: ``("qk", "ov")`` with
    ``qk_ov_circuits``, ``("qk",)`` with only ``qk_circuit`` (its scores are ``q . k``, but
    its values do not reach the out kernel linearly: retention), else ``()``."""
    if variant.qk_ov_circuits:
        return ("qk", "ov")
    return ("qk",) if getattr(variant, "qk_circuit", False) else ()


def _refusal(name: str, have: tuple[str, ...]) -> str:
    """The one-line reason ``model.attention=name`` has no (OV) circuit."""
    both = [n for n, v in ATTENTION_VARIANTS.items() if circuits_of(v) == ("qk", "ov")]
    qk_only = [n for n, v in ATTENTION_VARIANTS.items() if circuits_of(v) == ("qk",)]
    fit = " or ".join(repr(n) for n in both)
    why = getattr(ATTENTION_VARIANTS[name], "circuits_refused", "")
    if have:
        return (
            f"OV circuits need model.attention={fit}, not {name!r}: {why} (its QK circuit applies)"
        )
    why = why or "separate query, key, value and out kernels are needed"
    also = f"; QK circuits alone: {' or '.join(repr(n) for n in qk_only)}" if qk_only else ""
    return f"QK/OV circuits need model.attention={fit}{also}; not {name!r}: {why}"


def _check(model, stack: str, kind: str = "attn", need=("qk", "ov")) -> int:
    """The number of layers of ``stack``; a one-line ValueError if the ``need``ed circuits
    do not apply to its ``kind`` layers."""
    stacks = model.layer_stacks()
    if stack not in stacks:
        raise ValueError(f"stack={stack!r} is not one of this model's stacks {sorted(stacks)}")
    name = stack_attention(model, stack, kind)
    have = circuits_of(ATTENTION_VARIANTS[name])
    if any(c not in have for c in need):
        raise ValueError(_refusal(name, have))
    return stacks[stack]


def attention_weights(model, params, stack: str = "decoder", layer: int = 0, kind: str = "attn"):
    """One attention layer's kernels per query head (biases left out), as a dict:
    ``W_Q, W_K, W_V [N,D,H]`` (kv head ``n // (N // K)`` repeated to query head ``n``) and
    ``W_O [N,H,D]``. ``kind``: ``"attn"`` (self-attention) or ``"cross_attn"`` (the decoder of
    an encoder_decoder model; its keys and values read the encoder output). Scanned or
    unrolled ``params`` alike. Where only the QK circuit applies (retention), ``W_Q`` and
    ``W_K`` alone."""
    if kind not in ATTENTION_KEYS:
        raise ValueError(f"kind={kind!r} must be one of {sorted(ATTENTION_KEYS)}")
    L = _check(model, stack, kind, need=("qk",))
    if not 0 <= layer < L:
        raise ValueError(f"layer={layer} is out of range for stack {stack!r} of {L} layers")
    _, params = model.unrolled(params)
    block = params["params"][stack][f"layer_{layer}"]
    if ATTENTION_KEYS[kind] not in block:
        raise ValueError(f"stack {stack!r} of a {model.family} model has no {kind!r} layers")
    p = block[ATTENTION_KEYS[kind]]
    N, K = p["query"]["kernel"].shape[1], p["key"]["kernel"].shape[1]

    def per_query_head(kernel):  # [D,K,H] -> [N,D,H]
        return jnp.repeat(jnp.transpose(kernel, (1, 0, 2)), N // K, axis=0)

    weights = {
        "W_Q": jnp.transpose(p["query"]["kernel"], (1, 0, 2)),
        "W_K": per_query_head(p["key"]["kernel"]),
    }
    if "ov" in circuits_of(ATTENTION_VARIANTS[stack_attention(model, stack, kind)]):
        weights["W_V"] = per_query_head(p["value"]["kernel"])
        weights["W_O"] = p["out"]["kernel"]
    return weights


def qk_circuit(weights: dict) -> FactoredMatrix:
    """``QK[n] = W_Q[n] W_K[n]ᵀ`` ``[N,D,D]`` (rank H): the logit is ``x_q QK[n] x_kᵀ``."""
    return FactoredMatrix(weights["W_Q"], jnp.swapaxes(weights["W_K"], -1, -2))


def ov_circuit(weights: dict) -> FactoredMatrix:
    """``OV[n] = W_V[n] W_O[n]`` ``[N,D,D]`` (rank H): head ``n`` writes ``x OV[n]`` for an
    attended row ``x``."""
    if "W_V" not in weights:
        raise ValueError(
            "these weights have no W_V/W_O: attention_weights leaves them out of a layer "
            "whose OV circuit does not apply (see circuits_of)"
        )
    return FactoredMatrix(weights["W_V"], weights["W_O"])


def embedding_matrices(model, params) -> tuple[jax.Array, jax.Array]:
    """``(W_E [V,D], W_U [D,V])``: the token table (times sqrt(D) with
    ``scale_embeddings``) and the unembedding (tied: the table transposed, times D^-0.5 with
    ``scale_tied_output``; else the ``lm_head`` kernel). Positions and the final norm are left
    out."""
    cfg = model.config
    if cfg.input == "patches":
        raise ValueError(
            "a patch (image) model (model.input='patches') has no token embedding: its "
            "inputs are pixels, so there is no W_E to read circuits from"
        )
    table = params["params"]["embed"]["token_embed"]["embedding"]
    W_E = table * jnp.sqrt(float(cfg.d_model)) if cfg.scale_embeddings else table
    return W_E, unembedding_matrix(model, params)


def unembedding_matrix(model, params) -> jax.Array:
    """``W_U [D,V]``: the tied token table transposed (times D^-0.5 with
    ``scale_tied_output``), else the ``lm_head`` kernel (an image model's class head)."""
    cfg = model.config
    if not cfg.tie_embeddings:
        return params["params"]["head"]["lm_head"]["kernel"]
    table = params["params"]["embed"]["token_embed"]["embedding"]
    return table.T * cfg.d_model**-0.5 if cfg.scale_tied_output else table.T


def full_qk_circuit(model, params, layer: int, stack: str = "decoder", kind: str = "attn"):
    """``W_E QK W_Eᵀ`` ``[N,V,V]`` (factored, rank H): the logit between a query token and a
    key token read straight from the embeddings."""
    W_E, _ = embedding_matrices(model, params)
    return W_E @ qk_circuit(attention_weights(model, params, stack, layer, kind)) @ W_E.T


def full_ov_circuit(model, params, layer: int, stack: str = "decoder", kind: str = "attn"):
    """``W_E OV W_U`` ``[N,V,V]`` (factored, rank H): how attending to a token moves the
    output logits straight through the unembedding."""
    _check(model, stack, kind)
    W_E, W_U = embedding_matrices(model, params)
    return W_E @ ov_circuit(attention_weights(model, params, stack, layer, kind)) @ W_U


def copying_score(ov_full: FactoredMatrix) -> jax.Array:
    """``Re(Σλ) / Σ|λ|`` over the eigenvalues of each (square) circuit ``[..., M, M]`` ->
    ``[...]`` float: 1 for a pure copying head, -1 for a pure anti-copying head."""
    eig = ov_full.eigenvalues()
    return jnp.real(jnp.sum(eig, axis=-1)) / jnp.sum(jnp.abs(eig), axis=-1)


@jax.jit
def _composition(a: FactoredMatrix, b: FactoredMatrix) -> jax.Array:
    """``[N,N]`` scores of each head of ``a [N,D,D]`` (earlier) into each head of ``b``."""
    a = FactoredMatrix(a.A[:, None], a.B[:, None])  # earlier head on axis 0
    b = FactoredMatrix(b.A[None], b.B[None])  # later head on axis 1
    return (a @ b).frobenius_norm() / (a.frobenius_norm() * b.frobenius_norm())


def composition_scores(model, params, stack: str = "decoder") -> dict[str, jax.Array]:
    """Q-, K- and V-composition scores ``{"q", "k", "v"}`` of self-attention, each
    ``[L,N,L,N]``: ``[i, n, j, m]`` scores earlier head ``(i, n)`` into later head ``(j, m)``
    (NaN where ``j <= i``)."""
    L = _check(model, stack)
    model, params = model.unrolled(params)
    weights = [attention_weights(model, params, stack, i) for i in range(L)]
    qk = [qk_circuit(w) for w in weights]
    ov = [ov_circuit(w) for w in weights]

    N = model.config.num_heads
    later = {"q": qk, "k": [c.T for c in qk], "v": ov}
    out = {}
    for name, circuits in later.items():
        grid = [
            [
                _composition(ov[i], circuits[j]) if j > i else jnp.full((N, N), jnp.nan)
                for j in range(L)
            ]
            for i in range(L)
        ]
        out[name] = jnp.stack([jnp.stack(row, axis=1) for row in grid])  # [L,N,L,N]
    return out
