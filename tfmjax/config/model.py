"""The architecture section, ``[model]``: :class:`ModelConfig`, its checks and derived widths."""

from __future__ import annotations

import dataclasses

from tfmjax.config.attention_checks import check_mla_and_linear
from tfmjax.config.checks import check_types, one_of, positive, require
from tfmjax.config.choices import (
    ACTIVATIONS,
    ATTENTION_IMPLS,
    ATTENTIONS,
    DTYPES,
    FAMILIES,
    FEATURE_MAPS,
    NORM_POSITIONS,
    NORMS,
    PAIR_LAYOUTS,
    POSITIONS,
)
from tfmjax.config.cudnn_checks import check_cudnn
from tfmjax.config.derived import DerivedSizes
from tfmjax.config.fields import option
from tfmjax.config.linformer_checks import check_linformer
from tfmjax.config.lsh_checks import check_lsh, check_reversible
from tfmjax.config.mixer_checks import check_recurrent_mixer
from tfmjax.config.moe_checks import check_moe
from tfmjax.config.nystrom_checks import check_nystrom
from tfmjax.config.patch_checks import check_patches
from tfmjax.config.position_checks import check_position_options


@dataclasses.dataclass(frozen=True)
class ModelConfig(DerivedSizes):
    """Architecture. Only ``tfmjax/models/`` reads this."""

    family: str = option("encoder_decoder", help="encoder_decoder, decoder_only or encoder_only")
    vocab_size: int = option(
        32, help="token ids are 0 .. vocab_size-1 (which are special: pad_id, bos_id, eos_id)"
    )
    d_model: int = option(64, help="width D of the residual stream")
    num_heads: int = option(4, help="query heads N")
    num_kv_heads: int | None = option(
        None, help="key/value heads K: none = num_heads (MHA), 1 = MQA, else GQA"
    )
    head_dim: int | None = option(None, help="head width H; none = d_model // num_heads")
    scale_attention: bool = option(
        True, help="divide attention logits by sqrt(head width); T5 does not"
    )
    d_ff: int = option(256, help="feed-forward width F")
    num_layers: int = option(
        2, help="encoder layers (and decoder layers unless num_decoder_layers is set)"
    )
    num_decoder_layers: int | None = option(None, help="encoder_decoder only; none = num_layers")
    max_len: int = option(
        256, help="longest sequence the model accepts (size of a learned position table)"
    )
    position: str = option(
        "sinusoidal",
        help="sinusoidal, learned, rope, alibi, relative (T5 buckets), fire (learned bias of "
        "the normalised distance), abacus (digit place in its number) or none",
    )
    position_sampling: str = option(
        "ordered",
        help="ordered (0..T-1) or randomized: training rows take a sorted random subset of "
        "[0, max_position) (Ruoss et al. 2023; abacus: see abacus_spread)",
    )
    max_position: int | None = option(
        None, help="randomized sampling draws positions below this (>= max_len); none = max_len"
    )
    abacus_max_offset: int = option(
        100,
        help="abacus: training adds a random offset in [0, this) to digit places "
        "(randomized sampling: they range over max_len + this rows)",
    )
    abacus_spread: int = option(
        2,
        help="abacus, randomized sampling: a number's K places are a random K-subset of "
        "spread x K rows at a random start (1: a contiguous run)",
    )
    abacus_count_from: str = option(
        "start", help="abacus: an encoder counts each number's places from its start or end"
    )
    digit_first_id: int | None = option(
        None, help="abacus: the id of digit 0, digits being it and the next 9 (addition: 5)"
    )
    fire_hidden: int = option(32, help="fire: width of the MLP of the normalised distance")
    fire_threshold: float | None = option(
        None,
        help="fire: initial value of the learned threshold L in psi(max(L, i)); none = max_len",
    )
    sinusoidal_layout: str = option(
        "interleaved", help="sinusoidal features: interleaved sin/cos pairs or half_split"
    )
    position_offset: int = option(0, help="learned positions start at this table row (BART: 2)")
    rope_base: float = option(10000.0, help="RoPE frequency base")
    rope_layout: str = option(
        "interleaved",
        help="RoPE feature pairs: interleaved (2i, 2i+1) or half_split (i, i+H/2; HF)",
    )
    relative_buckets: int = option(32, help="T5 relative position buckets")
    relative_max_distance: int = option(128, help="T5 distance beyond which buckets are shared")
    norm: str = option("layernorm", help="layernorm or rmsnorm")
    norm_position: str = option(
        "pre", help="pre (norm inside each residual branch) or post (after the sum)"
    )
    norm_eps: float = option(1e-5, help="epsilon of the norms")
    activation: str = option(
        "relu", help="relu, gelu (exact), gelu_tanh, silu; gated: swiglu, geglu, geglu_tanh"
    )
    use_bias: bool = option(True, help="biases in the dense layers")
    attention_bias: bool | None = option(
        None, help="biases in the attention projections; none = use_bias"
    )
    mlp_bias: bool | None = option(None, help="biases in the feed-forward layers; none = use_bias")
    tie_embeddings: bool = option(True, help="the output projection reuses the token embedding")
    scale_tied_output: bool = option(
        False, help="multiply by d_model^-0.5 before a tied output projection (T5)"
    )
    scale_embeddings: bool = option(False, help="multiply token embeddings by sqrt(d_model)")
    type_vocab_size: int = option(
        0, help="BERT segment embeddings (batch key token_types); 0 = none"
    )
    embed_norm: bool = option(
        False, help="a norm after summing the embeddings (BERT, BART's layernorm_embedding)"
    )
    per_side_embeddings: bool = option(
        False, help="encoder_decoder: own position table and embed norm per side"
    )
    mlm_head: bool = option(
        False, help="masked-LM transform before the output: dense, activation, norm (BERT)"
    )
    output_bias: bool = option(
        False, help="a learned bias [V] on the logits (BERT, BART's final_logits_bias)"
    )
    vocab_multiple: int = option(
        1,
        help="the output projection runs over vocab_size rounded up to a multiple of this "
        "(GPU matmuls prefer 128: GPT-2's 50,257 -> 50,304); the extra columns are zeros cut "
        "off before any loss or sample, and params, checkpoints and exports keep vocab_size",
    )
    dropout_rate: float = option(0.0, help="residual dropout: embeddings and every sublayer output")
    window: int | None = option(
        None, help="sliding-window attention: past positions a query sees; none = all"
    )
    attention_stride: int | None = option(
        None,
        help="Sparse Transformer strided pattern: |p-s| < stride or "
        "(p-s) % stride == 0; none = off",
    )
    global_tokens: int = option(
        0, help="Longformer global tokens: the first N positions see and are seen by all"
    )
    random_blocks: int = option(
        0,
        help="BigBird random attention: key blocks each query block also sees (a seeded "
        "hash draws them; with model.window or attention_stride); 0 = off",
    )
    random_block_size: int = option(16, help="BigBird: positions per block of random_blocks")
    random_blocks_seed: int = option(0, help="BigBird: the seed that fixes the random blocks")
    attention: str = option(
        "softmax",
        help="self-attention system: softmax, mla (latent KV), linear (kernelised), retention "
        "(RetNet), selective_scan (Mamba) or rwkv (RWKV-4 time-mix; its channel-mix replaces "
        "the feed-forward), all three causal: an encoder keeps softmax; nystrom "
        "(Nystromformer landmarks) or linformer (sequence projections), both bidirectional: "
        "a decoder keeps softmax; lsh (Reformer: shared-QK hashed buckets, sorted chunks)",
    )
    kv_rank: int | None = option(
        None, help="mla: latent width R of keys/values (none: 4 head widths)"
    )
    q_rank: int | None = option(
        None, help="mla: latent width of queries (none: no query compression)"
    )
    rope_dim: int | None = option(
        None, help="mla with rope: decoupled RoPE features per head (none: half a head)"
    )
    feature_map: str = option(
        "elu", help="linear attention feature map: elu (elu+1) or favor (FAVOR+)"
    )
    num_features: int = option(64, help="linear attention with favor: random features F")
    ssm_state: int = option(16, help="selective_scan: state size P per channel")
    ssm_expand: int = option(2, help="selective_scan: channels E = ssm_expand * d_model")
    ssm_conv: int = option(4, help="selective_scan: width W of the causal convolution")
    num_landmarks: int = option(
        8, help="nystrom: landmarks M, segment means of queries and keys (M = length: exact)"
    )
    nystrom_conv: int = option(
        0,
        help="nystrom: width W (odd; the paper: 33) of a depthwise convolution over V added "
        "to the output; 0 = none",
    )
    linformer_rank: int = option(
        8,
        help="linformer: projected keys/values R (the paper's k), each a learned mix of the "
        "model.max_len positions; at most model.max_len",
    )
    linformer_share_kv: bool = option(
        False, help="linformer: one projection for keys and values (the paper's E = F)"
    )
    lsh_buckets: int = option(8, help="lsh: hash buckets per round (1, or even)")
    lsh_rounds: int = option(2, help="lsh: hash rounds, each its own random rotation")
    lsh_chunk: int = option(
        32, help="lsh: tokens per chunk of the sorted row (it sees its own and the previous chunk)"
    )
    lsh_seed: int = option(0, help="lsh: the seed of the fixed random rotations")
    reversible: bool = option(
        False,
        help="reversible residual layers (Reformer): two streams, activations recomputed in "
        "the backward pass instead of stored; decoder_only and encoder_only",
    )
    moe_experts: int = option(
        0, help="mixture of experts: experts E per MoE feed-forward; 0 = dense feed-forwards"
    )
    moe_top_k: int = option(1, help="MoE: experts per token (1 = Switch, 2 = GShard/Mixtral)")
    moe_every: int = option(
        1, help="MoE: every n-th block's feed-forward is a mixture (blocks n-1, 2n-1, ...)"
    )
    moe_capacity_factor: float = option(
        0.0,
        help="MoE, training: slots per expert = ceil(factor * n * top_k / E) in a sequence of "
        "n tokens (padding aside); tokens over it skip the feed-forward (residual only); "
        "0 = dropless (Mixtral; Switch: 1.25)",
    )
    moe_eval_capacity_factor: float | None = option(
        0.0,
        help="MoE: the capacity factor of every forward without dropout (evaluation, "
        "decoding's prefill, interp); 0 = dropless, so a teacher-forced evaluation sees what "
        "KV-cached decoding sees; none = moe_capacity_factor",
    )
    moe_renormalize: bool | None = option(
        None,
        help="MoE: gates renormalised over the chosen experts; none = for top_k > 1 "
        "(GShard/Mixtral), raw router probability for top_k = 1 (Switch)",
    )
    moe_aux_loss_weight: float = option(
        0.01, help="MoE: weight of the Switch load-balancing loss E * sum_i f_i * P_i"
    )
    moe_z_loss_weight: float = option(
        0.001, help="MoE: weight of the ST-MoE router z-loss, mean logsumexp(router logits)^2"
    )
    attention_impl: str = option(
        "auto",
        help="auto, reference, xla, blockwise, pallas or cudnn (CUDA only; bfloat16; causal, "
        "padding and causal-window masks)",
    )
    scan_layers: bool = option(
        True, help="scan the layer stack (one compiled layer) instead of unrolling it"
    )
    remat: bool = option(False, help="recompute activations in the backward pass to save memory")
    dtype: str = option(
        "float32", help="compute dtype (float32 or bfloat16); parameters stay float32"
    )
    bos_id: int = option(1, help="the id decoders are fed first")
    pad_id: int | None = option(
        0,
        help="the padding id: where a batch or prompt gives no segment ids or lengths, tokens "
        "equal to it are padding; none = no padding id (every id is a token: padding only "
        "from explicit lengths or segment ids, as an HF attention mask)",
    )
    eos_id: int | None = option(
        2, help="generation stops a row after this id (none: only after max_new_tokens)"
    )
    prompt_bos: bool = option(
        True,
        help="decoder_only generation feeds bos_id before each prompt; false: it continues "
        "exactly the ids given (imported HF models, as transformers does)",
    )
    input: str = option(
        "tokens",
        help="tokens (ids through an embedding table) or patches: images cut into "
        "patch_size squares, each flattened and projected, behind a class token whose final "
        "state names one of vocab_size classes (ViT, Dosovitskiy et al. 2021; encoder_only)",
    )
    image_size: int | None = option(
        None, help="patches: height and width of the square images, in pixels"
    )
    patch_size: int | None = option(
        None, help="patches: side of a square patch, in pixels (must divide image_size)"
    )
    channels: int = option(1, help="patches: colour channels C of the images [B,H,W,C]")

    def __post_init__(self):
        check_types("model", self)
        self._check_names_and_ranges()
        check_mla_and_linear(self)
        self._check_heads_and_positions()
        self._check_embeddings_and_layers()
        check_moe(self)
        check_recurrent_mixer(self)
        check_nystrom(self)
        check_linformer(self)
        check_lsh(self)
        check_reversible(self)
        check_patches(self)
        check_position_options(self)
        require(  # after the systems that refuse sparse patterns have said so
            not self.random_blocks or self.window is not None or self.attention_stride is not None,
            "model.random_blocks",
            self.random_blocks,
            "BigBird's random blocks join a sparse pattern: set model.window (or "
            "model.attention_stride), or 0",
        )
        require(
            not self.random_blocks or self.random_block_size < self.max_len,
            "model.random_block_size",
            self.random_block_size,
            f"must be below model.max_len={self.max_len}: one block leaves nothing to draw",
        )
        if self.attention_impl == "cudnn":
            check_cudnn(self)

    def _check_names_and_ranges(self) -> None:
        """Enumerated fields name a valid option; sizes are positive."""
        one_of("model.family", self.family, FAMILIES)
        one_of("model.position", self.position, POSITIONS)
        one_of("model.norm", self.norm, NORMS)
        one_of("model.norm_position", self.norm_position, NORM_POSITIONS)
        one_of("model.activation", self.activation, ACTIVATIONS)
        one_of("model.rope_layout", self.rope_layout, PAIR_LAYOUTS)
        one_of("model.sinusoidal_layout", self.sinusoidal_layout, PAIR_LAYOUTS)
        one_of("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
        one_of("model.attention", self.attention, ATTENTIONS)
        one_of("model.feature_map", self.feature_map, FEATURE_MAPS)
        one_of("model.dtype", self.dtype, DTYPES)
        positive(
            "model",
            self,
            "vocab_size",
            "vocab_multiple",
            "d_model",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "d_ff",
            "num_layers",
            "num_decoder_layers",
            "max_len",
            "rope_base",
            "relative_buckets",
            "relative_max_distance",
            "norm_eps",
            "attention_stride",
            "kv_rank",
            "q_rank",
            "num_features",
            "ssm_state",
            "ssm_expand",
            "ssm_conv",
            "num_landmarks",
            "random_block_size",
        )
        for name in ("global_tokens", "random_blocks", "random_blocks_seed"):
            require(getattr(self, name) >= 0, f"model.{name}", getattr(self, name), "must be >= 0")

    def _check_heads_and_positions(self) -> None:
        """Head widths divide evenly and suit the position scheme."""
        if self.head_dim is None:
            require(
                self.d_model % self.num_heads == 0,
                "model.d_model",
                self.d_model,
                f"must be divisible by model.num_heads={self.num_heads} (or set model.head_dim)",
            )
        require(
            self.num_heads % self.kv_heads == 0,
            "model.num_heads",
            self.num_heads,
            f"must be divisible by model.num_kv_heads={self.kv_heads}",
        )
        if self.position == "rope":
            require(
                self.head_width % 2 == 0,
                "model.head_dim",
                self.head_width,
                "RoPE rotates pairs of features, so the head width must be even",
            )
        if self.position in ("relative", "fire"):
            require(
                self.attention_impl in ("auto", "xla", "reference"),
                "model.attention_impl",
                self.attention_impl,
                f"cannot add the dense {'T5 relative' if self.position == 'relative' else 'FIRE'} "
                f"bias of model.position={self.position!r}: use 'auto', 'xla' or 'reference'",
            )

    def _check_embeddings_and_layers(self) -> None:
        """Embedding options, dropout, the BOS id and the decoder's depth."""
        require(
            self.type_vocab_size >= 0, "model.type_vocab_size", self.type_vocab_size, "must be >= 0"
        )
        require(
            self.position_offset >= 0, "model.position_offset", self.position_offset, "must be >= 0"
        )
        if self.per_side_embeddings:
            require(
                self.family == "encoder_decoder",
                "model.per_side_embeddings",
                True,
                "only encoder_decoder models have two sides",
            )
        if self.mlm_head:
            require(
                self.activation in ("relu", "gelu", "gelu_tanh", "silu"),
                "model.mlm_head",
                self.mlm_head,
                f"needs a non-gated model.activation (relu, gelu, gelu_tanh, silu), "
                f"not {self.activation!r}",
            )
        require(
            0.0 <= self.dropout_rate < 1.0,
            "model.dropout_rate",
            self.dropout_rate,
            "must be in [0, 1)",
        )
        if self.window is not None:
            require(self.window >= 0, "model.window", self.window, "must be >= 0 or none")
        require(
            0 <= self.bos_id < self.vocab_size,
            "model.bos_id",
            self.bos_id,
            f"must be a token id in [0, model.vocab_size={self.vocab_size})",
        )
        for name in ("pad_id", "eos_id"):
            value = getattr(self, name)
            require(
                value is None or 0 <= value < self.vocab_size,
                f"model.{name}",
                value,
                f"must be a token id in [0, model.vocab_size={self.vocab_size}) or none",
            )
        require(
            self.pad_id is None or self.pad_id != self.eos_id,
            "model.pad_id",
            self.pad_id,
            f"must differ from model.eos_id={self.eos_id}: ids equal to the pad id are read as "
            "padding, so every EOS would be masked; give EOS an id of its own, or set "
            "model.pad_id = none (no padding id: padding from lengths or segment ids)",
        )
        if self.family != "encoder_decoder":
            require(
                self.num_decoder_layers is None,
                "model.num_decoder_layers",
                self.num_decoder_layers,
                "only encoder_decoder models have a separate decoder",
            )
