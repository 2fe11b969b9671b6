"""Each enumeration has one source (tfmjax.config); the registries that implement it agree."""

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tfmjax import config as C
from tfmjax import kernels, models
from tfmjax.data import make_task
from tfmjax.data.sources import open_source
from tfmjax.evaluation.evaluator import Evaluator
from tfmjax.evaluation.image_evaluator import ImageEvaluator
from tfmjax.evaluation.text_evaluator import TextEvaluator
from tfmjax.models.common import DTYPES
from tfmjax.train import schedules
from tfmjax.train.state import SUM_KEYS, WINDOW_KEYS, empty_window
from tfmjax.train.step import batch_sums

ROOT = Path(__file__).resolve().parents[1] / "tfmjax"


def test_families_are_the_configs_families():
    assert tuple(models.FAMILIES) == C.FAMILIES
    for name, cls in models.FAMILIES.items():
        assert cls.family == name
        model = models.build(C.ModelConfig(family=name))
        assert set(model.dummy_batch()) == set(cls.token_keys)


def test_attention_impls_are_the_configs_impls():
    assert tuple(kernels.IMPLS) == C.ATTENTION_IMPLS


def test_rule_sets_are_the_configs_rule_sets():
    from tfmjax.layers.axes import AXES
    from tfmjax.parallel import RULE_SETS

    assert tuple(RULE_SETS) == C.RULE_SETS
    for rules in RULE_SETS.values():
        for logical, mesh_axes in rules:
            assert logical in AXES
            axes = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
            assert set(axes) <= set(C.MESH_AXES)


def test_feature_maps_are_the_configs_feature_maps():
    from tfmjax.kernels import linear

    assert set(C.FEATURE_MAPS) == set(linear.FEATURE_MAPS)


def test_attention_systems_are_the_configs_attentions():
    """The variants table of tfmjax.layers is the one list of ``model.attention`` names
    (the config, below layers, holds the same names to validate a value)."""
    from tfmjax.layers.attention_variants import ATTENTION_NAMES

    assert ATTENTION_NAMES == C.ATTENTIONS


def test_causal_only_attentions_are_the_variants_that_say_so():
    """The config refuses an encoder_only model with these (tfmjax.config.mixer_checks)."""
    from tfmjax.layers.attention_variants import CAUSAL_ONLY

    assert CAUSAL_ONLY == C.CAUSAL_ONLY_ATTENTIONS


def test_bidirectional_only_attentions_are_the_variants_that_say_so():
    """The config refuses a decoder_only model with these (tfmjax.config.nystrom_checks)."""
    from tfmjax.layers.attention_variants import BIDIRECTIONAL_ONLY

    assert BIDIRECTIONAL_ONLY == C.BIDIRECTIONAL_ONLY_ATTENTIONS


def test_every_attention_system_builds_a_block():
    """Each ``model.attention`` value is a self-attention module the blocks build (in a
    decoder_only model, or an encoder_only one for the bidirectional-only variants)."""
    for attention in C.ATTENTIONS:
        bidirectional = attention in C.BIDIRECTIONAL_ONLY_ATTENTIONS
        cfg = C.ModelConfig(
            family="encoder_only" if bidirectional else "decoder_only",
            vocab_size=16,
            d_model=16,
            num_heads=2,
            d_ff=32,
            num_layers=1,
            attention=attention,
        )
        params = jax.eval_shape(  # the names only: no compile
            models.build(cfg).init, jax.random.key(0), {"tokens": jnp.ones((1, 4), int)}
        )
        stack = params["params"]["encoder" if bidirectional else "decoder"]["layers"]
        names = set(stack["attention"])
        expected = {
            "mla": {"kv_down", "kv_norm", "key_up", "value_up", "query", "out"},
            "retention": {"query", "key", "value", "gate", "norm_scale", "norm_bias", "out"},
            "selective_scan": {"in_proj", "conv_kernel", "conv_bias", "x_proj", "dt_proj"}
            | {"A_log", "D_skip", "out_proj"},
            "linformer": {"query", "key", "value", "out", "proj_e", "proj_f"},
            "rwkv": {"receptance", "key", "value", "output", "time_decay", "time_first"}
            | {"time_mix_r", "time_mix_k", "time_mix_v"},
            "lsh": {"query", "value", "out"},  # shared QK: no key projection
        }
        assert names == expected.get(attention, {"query", "key", "value", "out"})


def test_every_configured_schedule_is_built():
    assert schedules.SCHEDULE_NAMES == C.SCHEDULES
    for name in C.SCHEDULES:
        fn = schedules.make_schedule(name, peak_lr=1.0, warmup_steps=2, total_steps=10, d_model=16)
        assert np.isfinite(float(fn(5)))


def test_dtypes_are_the_configs_dtypes():
    assert tuple(DTYPES) == C.DTYPES
    assert all(DTYPES[name] == jnp.dtype(name) for name in C.DTYPES)


def test_window_sums_are_the_step_sums():
    logits = jnp.zeros((1, 3, 5))
    sums = batch_sums(logits, jnp.ones((1, 3), jnp.int32), jnp.ones((1, 3)), 0.0)
    assert tuple(sums) == SUM_KEYS
    assert set(SUM_KEYS) < set(WINDOW_KEYS) == set(empty_window())


def test_best_metric_choices_are_evaluator_metrics(random_params):
    cfg = C.ModelConfig(
        family="decoder_only", vocab_size=16, d_model=16, num_heads=2, d_ff=32, num_layers=1
    )
    evaluator = Evaluator(
        cfg, make_task("copy", num_symbols=5, max_len=4), batch_size=4, num_examples=4
    )
    metrics, _ = evaluator(random_params(evaluator.model))
    assert set(evaluator.metric_names) <= set(metrics)
    text = TextEvaluator(
        dataclasses.replace(cfg, vocab_size=96),
        open_source("shakespeare", {"context": 8, "samples": 1}),
        batch_size=4,
        num_examples=4,
    )
    text_metrics, _ = text(random_params(text.model))
    assert set(text.metric_names) <= set(text_metrics)
    images = ImageEvaluator(
        C.get_preset("tiny-vit"), open_source("digits", {}), batch_size=64, num_examples=70
    )
    image_metrics, rows = images(random_params(images.model))
    assert set(images.metric_names) <= set(image_metrics) and image_metrics["num_examples"] == 70
    assert len(rows) == 5 and {"input", "prediction", "target", "correct"} <= set(rows[0])
    names = set(evaluator.metric_names) | set(text.metric_names) | set(images.metric_names)
    assert set(C.EVAL_METRICS) == names - {"unigram_accuracy", "chance_accuracy"}
    assert set(C.LOWER_IS_BETTER) <= set(C.EVAL_METRICS)


def test_no_family_names_compared_outside_models_and_config():
    """Code outside models/ asks the model (tfmjax.models.family), never its family name."""
    pattern = re.compile(
        r"family\s*(==|!=|\bin\b|\bnot in\b)|(==|!=)\s*['\"](encoder_decoder|"
        r"decoder_only|encoder_only)['\"]"
    )
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("models/", "config/")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"tfmjax/{rel}:{number}: {line.strip()}")
    assert not offenders, "family names compared outside models/:\n" + "\n".join(offenders)
