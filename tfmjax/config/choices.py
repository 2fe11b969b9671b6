"""The valid names of each enumerated config field.

Each tuple is the one list of names; the registries that implement them
(tfmjax.models.FAMILIES, tfmjax.kernels.IMPLS, tfmjax.train.schedules, the evaluator's
metrics) are checked against it in tests/test_registries.py.
"""

FAMILIES = ("encoder_decoder", "decoder_only", "encoder_only")
INPUTS = ("tokens", "patches")  # model.input: token ids, or images cut into patches (ViT)
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "relative", "fire", "abacus", "none")
POSITION_SAMPLINGS = ("ordered", "randomized")
ABACUS_COUNTS = ("start", "end")  # model.abacus_count_from
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
PAIR_LAYOUTS = ("interleaved", "half_split")  # model.rope_layout, model.sinusoidal_layout
ATTENTION_IMPLS = ("auto", "reference", "xla", "blockwise", "pallas", "cudnn")
FEATURE_MAPS = ("elu", "favor")  # model.feature_map of linear attention
DTYPES = ("float32", "bfloat16")
SCHEDULES = ("inverse_sqrt", "cosine", "linear", "constant", "wsd")
MESH_AXES = ("data", "fsdp", "expert", "tensor")  # mesh.data, mesh.fsdp, ..., in this order
RULE_SETS = ("standard", "replicated")  # mesh.rules: see tfmjax.parallel.rules
EVAL_METRICS = (
    "exact_match",
    "token_accuracy",
    "loss",
    "perplexity",
    "bits_per_char",
    "accuracy",  # an image classifier's test accuracy
)
LOWER_IS_BETTER = ("loss", "perplexity", "bits_per_char")

# model.attention: the self-attention system, the keys of the variants table
# (tfmjax.layers.attention_variants.ATTENTION_VARIANTS), which tests/test_registries.py pins.
ATTENTIONS = (
    "softmax",
    "mla",
    "linear",
    "retention",
    "selective_scan",
    "rwkv",
    "nystrom",
    "linformer",
    "lsh",
)
# The causal-only ones (no bidirectional form; the variants' ``causal_only``): an encoder
# keeps softmax self-attention, encoder_only refuses them (tfmjax.config.mixer_checks).
CAUSAL_ONLY_ATTENTIONS = ("retention", "selective_scan", "rwkv")
# The bidirectional-only ones (no causal form; the variants' ``bidirectional_only``): a
# decoder keeps softmax self-attention, decoder_only refuses them (tfmjax.config.nystrom_checks).
BIDIRECTIONAL_ONLY_ATTENTIONS = ("nystrom", "linformer")
