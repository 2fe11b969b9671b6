"""Configs are data: TOML + overrides, every field validated with one readable line."""

import dataclasses
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfmjax import config as C
from tfmjax.models import InputError, build

BAD = [
    ({"model": {"attention": "flash"}}, "model.attention='flash' is invalid: must be one of"),
    (
        {"model": {"attention": "mla", "num_kv_heads": 2}},
        "model.num_kv_heads=2 is invalid: model.attention='mla' compresses keys and values",
    ),
    (
        {"model": {"attention": "mla", "position": "rope", "rope_dim": 5}},
        r"model.rope_dim=5 is invalid: must be even and in \(0, head width 16\)",
    ),
    (
        {"model": {"attention": "mla", "rope_dim": 4}},
        "model.rope_dim=4 is invalid: decoupled RoPE features need model.position='rope'",
    ),
    ({"model": {"kv_rank": 8}}, "model.kv_rank=8 is invalid: applies to model.attention='mla'"),
    (
        {"model": {"attention": "linear", "position": "alibi"}},
        "model.position='alibi' is invalid: linear attention has no score matrix",
    ),
    (
        {"model": {"attention": "linear", "attention_stride": 4}},
        "model.attention_stride=4 is invalid: sparse patterns apply to softmax and mla",
    ),
    ({"model": {"feature_map": "relu"}}, "model.feature_map='relu' is invalid: must be one of"),
    ({"model": {"attention_stride": 0}}, "model.attention_stride=0 is invalid: must be > 0"),
    ({"model": {"global_tokens": -1}}, "model.global_tokens=-1 is invalid: must be >= 0"),
    ({"model": {"random_blocks": -1}}, "model.random_blocks=-1 is invalid: must be >= 0"),
    (
        {"model": {"random_blocks": 2}},
        "model.random_blocks=2 is invalid: BigBird's random blocks join a sparse pattern",
    ),
    (
        {"model": {"random_blocks": 1, "window": 2, "random_block_size": 0}},
        "model.random_block_size=0 is invalid: must be > 0",
    ),
    (
        {"model": {"random_blocks": 1, "window": 2, "random_block_size": 4096, "max_len": 64}},
        "model.random_block_size=4096 is invalid: must be below model.max_len=64",
    ),
    (
        {"model": {"d_model": 60, "num_heads": 8}},
        "model.d_model=60 is invalid: must be divisible by model.num_heads=8",
    ),
    (
        {"model": {"num_heads": 4, "num_kv_heads": 3}},
        "model.num_heads=4 is invalid: must be divisible by model.num_kv_heads=3",
    ),
    (
        {"model": {"activation": "swish"}},
        "model.activation='swish' is invalid: must be one of relu",
    ),
    ({"model": {"position": "rotary"}}, "model.position='rotary' is invalid: must be one of"),
    (
        {"model": {"position": "rope", "d_model": 12, "num_heads": 4}},
        "model.head_dim=3 is invalid: RoPE rotates pairs",
    ),
    ({"model": {"d_ff": 0}}, "model.d_ff=0 is invalid: must be > 0"),
    ({"model": {"num_layers": -2}}, "model.num_layers=-2 is invalid: must be > 0"),
    ({"model": {"vocab_size": "32"}}, "model.vocab_size='32' is invalid: must be int"),
    ({"model": {"dropout_rate": 1.5}}, r"model.dropout_rate=1.5 is invalid: must be in \[0, 1\)"),
    ({"model": {"norm": "batchnorm"}}, "model.norm='batchnorm' is invalid"),
    ({"model": {"bos_id": 40, "vocab_size": 32}}, "model.bos_id=40 is invalid"),
    ({"model": {"pad_id": 32, "vocab_size": 32}}, r"model.pad_id=32 is invalid: .*or none"),
    ({"model": {"eos_id": -1}}, r"model.eos_id=-1 is invalid: must be a token id"),
    ({"model": {"pad_id": "0"}}, "model.pad_id='0' is invalid: must be int or none"),
    (
        {"model": {"pad_id": 2, "eos_id": 2}},
        r"model.pad_id=2 is invalid: must differ from model.eos_id=2: .* model.pad_id = none",
    ),
    (
        {"model": {"family": "decoder_only", "num_decoder_layers": 2}},
        "only encoder_decoder models have a separate decoder",
    ),
    (
        {"model": {"position": "relative", "attention_impl": "blockwise"}},
        "model.attention_impl='blockwise' is invalid: cannot add the dense T5 relative bias",
    ),
    ({"model": {"dmodel": 64}}, "unknown key model.dmodel \\(did you mean 'd_model'\\?\\)"),
    ({"optim": {"lr": 1e-3}}, "unknown key optim.lr \\(did you mean 'optim.learning_rate'\\?\\)"),
    ({"optim": {"wd": 0.1}}, "unknown key optim.wd \\(did you mean 'optim.weight_decay'\\?\\)"),
    ({"optim": {"bs": 8}}, "unknown key optim.bs \\(did you mean 'data.batch_size'\\?\\)"),
    (
        {"train": {"batch_size": 8}},
        "unknown key train.batch_size \\(did you mean 'data.batch_size'",
    ),
    (
        {"model": {"preset": "gpt-2-small"}},
        "model.preset='gpt-2-small' is unknown \\(did you mean 'gpt2-small'\\?\\)",
    ),
    ({"optim": {"schedule": "cosin"}}, "optim.schedule='cosin' is invalid: must be one of"),
    ({"optim": {"learning_rate": -1e-3}}, "optim.learning_rate=-0.001 is invalid: must be > 0"),
    ({"optim": {"b2": 1.0}}, r"optim.b2=1.0 is invalid: must be in \[0, 1\)"),
    ({"train": {"steps": 0}}, "train.steps=0 is invalid: must be > 0"),
    (
        {"train": {"best_metric": "acc"}},
        "train.best_metric='acc' is invalid: must be one of exact_match, token_accuracy",
    ),
    (
        {"data": {"batch_size": 10}, "optim": {"grad_accum_steps": 4}},
        "data.batch_size=10 is invalid: must be divisible by optim.grad_accum_steps=4",
    ),
    ({"data": {"batch_size": True}}, "data.batch_size=True is invalid: must be int"),
    ({"trian": {"steps": 3}}, r"unknown section \[trian\] \(did you mean 'train'\?\)"),
]


@pytest.mark.parametrize("raw, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_config_gives_one_line(raw, message):
    with pytest.raises(C.ConfigError, match=message) as info:
        C.from_dict(raw)
    assert "\n" not in str(info.value)


def test_load_toml_with_preset_and_overrides(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(
        textwrap.dedent("""
        [model]
        preset = "tiny-llama"
        num_layers = 3
        [optim]
        learning_rate = 3e-4
        [data]
        task = "sort"
        task_params = { max_len = 6 }
    """)
    )
    exp = C.load(
        path,
        [
            "model.d_model=128",
            "model.window=none",
            "optim.schedule=wsd",
            "data.task_params.min_len=2",
            'train.workdir="/tmp/x"',
        ],
    )
    assert exp.name == "exp"
    assert (exp.model.family, exp.model.position, exp.model.kv_heads) == ("decoder_only", "rope", 2)
    assert exp.model.num_layers == 3 and exp.model.d_model == 128 and exp.model.window is None
    assert exp.optim.learning_rate == 3e-4 and exp.optim.schedule == "wsd"
    assert exp.data.task_params == {"max_len": 6, "min_len": 2}
    assert exp.workdir == "/tmp/x"
    # ``none`` is None for an optional field, and the string "none" for a string field.
    assert C.load(path, ["model.position=none"]).model.position == "none"
    with pytest.raises(C.ConfigError, match="model.norm='none' is invalid"):
        C.load(path, ["model.norm=none"])


def test_round_trip_through_json():
    exp = C.from_dict({"model": {"preset": "tiny-gpt2"}}, name="rt")
    assert C.from_dict(exp.to_dict()) == exp


def test_diff_is_readable():
    a = C.Experiment()
    b = dataclasses.replace(a, model=dataclasses.replace(a.model, d_model=128))
    assert C.diff(a, b) == ["model.d_model: 64 != 128"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.d_model", "must look like section.key=value"),
        ("d_model=3", "must look like section.key=value"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(C.ConfigError, match=message):
        C.apply_overrides({}, [override])


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(C.ConfigError, match="does not exist"):
        C.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nd_model = 3")
    with pytest.raises(C.ConfigError, match="not valid TOML"):
        C.load(bad)


def test_a_config_file_is_never_executed(tmp_path):
    path = tmp_path / "evil.toml"
    path.write_text("[model]\nfamily = \"__import__('os').system('touch pwned')\"\n")
    with pytest.raises(C.ConfigError, match="model.family="):
        C.load(path)
    assert not (tmp_path / "pwned").exists()


MODEL = C.ModelConfig(family="decoder_only", vocab_size=10, position="learned", max_len=8)


@pytest.mark.parametrize(
    "batch, message",
    [
        (
            {"tokens": np.array([[1, 2, 10]])},
            r"token id 10 at index \[0, 2\] outside the vocabulary \[0, 10\)",
        ),
        ({"tokens": np.array([[1, -1, 3]])}, r"token id -1 at index \[0, 1\]"),
        (
            {"tokens": np.ones((1, 9), np.int32)},
            "length 9 but the model takes at most model.max_len=8",
        ),
        ({"tokens": np.ones((1, 3), np.float32)}, "must be integer token ids"),
        ({"inputs": np.ones((1, 3), np.int32)}, "needs key 'tokens'"),
        ({"tokens": np.ones(3, np.int32)}, r"must be \[batch, length\]"),
    ],
)
def test_bad_batches_are_one_line(batch, message):
    """check_batch refuses each bad batch with an InputError of one line naming the problem."""
    with pytest.raises(InputError, match=message) as info:
        build(MODEL).check_batch(batch)
    assert "\n" not in str(info.value)


def test_good_batch_passes_and_max_len_holds_for_every_position_encoding():
    build(MODEL).check_batch({"tokens": jnp.array([[0, 9, 3]])})
    for position in ("sinusoidal", "rope", "alibi", "relative", "none"):
        model = build(dataclasses.replace(MODEL, position=position))
        model.check_batch({"tokens": np.ones((1, 8), np.int32)})
        with pytest.raises(
            InputError, match="length 9 but the model takes at most model.max_len=8"
        ):
            model.check_batch({"tokens": np.ones((1, 9), np.int32)})


@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder", "encoder_only"])
def test_eager_apply_refuses_token_ids_outside_the_vocabulary(random_params, family):
    """JAX clamps out-of-range gathers; an eager apply with concrete ids checks them (and the
    length) first, with one-line InputErrors."""
    model = build(
        C.ModelConfig(family=family, vocab_size=10, d_model=8, num_heads=2, d_ff=8, num_layers=1)
    )
    batch = model.dummy_batch(1, 4)
    params = random_params(model)
    key = model.token_keys[-1]
    bad = dict(batch, **{key: batch[key].at[0, 2].set(10)})
    with pytest.raises(
        InputError, match=rf"{key} has token id 10 at index \[0, 2\] outside"
    ) as info:
        model.apply(params, bad)
    assert "\n" not in str(info.value)
    long = model.dummy_batch(1, model.config.max_len + 1)
    with pytest.raises(InputError, match="but the model takes at most model.max_len=") as info:
        model.apply(params, long)
    assert "\n" not in str(info.value)
    jax.jit(model.apply)(params, bad)  # under jit the host-side check_batch is the check


def test_a_config_without_the_token_fields_keeps_the_old_behaviour():
    """Checkpoints written before model.pad_id, eos_id and prompt_bos existed lack the keys:
    they load with 0 as padding, EOS 2 and BOS before each prompt, as they ran then."""
    raw = json.loads(json.dumps(dataclasses.asdict(C.Experiment())))
    for key in ("pad_id", "eos_id", "prompt_bos"):
        del raw["model"][key]
    model = C.from_dict(raw).model
    assert (model.pad_id, model.eos_id, model.prompt_bos) == (0, 2, True)


def test_none_token_ids_in_toml_and_overrides(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[model]\npad_id = "none"\nposition = "none"\n')
    experiment = C.load(path, ["model.eos_id=none"])
    assert (experiment.model.pad_id, experiment.model.eos_id) == (None, None)
    assert experiment.model.position == "none"


def test_every_alias_points_at_a_real_key():
    from tfmjax.config.loading import ALIASES

    for alias, target in ALIASES.items():
        section, key = target.split(".")
        assert key in {f.name for f in dataclasses.fields(C.SECTIONS[section])}, alias
