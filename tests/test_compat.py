"""The jax version facts in one place: pyproject's jax range, its accelerator extras and
``tfmjax.compat`` agree; the untested-version note; the Pallas Triton custom-call target and
which jax warns that the Triton backend is deprecated."""

import re
import tomllib
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from packaging.requirements import Requirement
from packaging.version import Version

from tfmjax import compat

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
ACCELERATOR_EXTRAS = ("cuda12", "cuda13", "tpu")


def base_jax() -> Requirement:
    (jax_req,) = [r for r in map(Requirement, PROJECT["dependencies"]) if r.name == "jax"]
    return jax_req


@pytest.mark.parametrize("extra", ACCELERATOR_EXTRAS)
def test_each_accelerator_extra_is_jax_own_extra_with_the_base_range(extra):
    (req,) = map(Requirement, PROJECT["optional-dependencies"][extra])
    assert (req.name, req.extras) == ("jax", {extra})
    assert req.specifier == base_jax().specifier


def test_the_jax_range_admits_exactly_the_tested_minors():
    spec = base_jax().specifier
    admitted = {
        (0, minor)
        for minor in range(30)
        if any(Version(f"0.{minor}.{patch}") in spec for patch in (0, 99))
    }
    assert admitted == set(compat.TESTED_JAX_MINORS)


def test_the_suite_runs_on_a_tested_jax():
    """On another minor this fails on purpose: docs/accelerators.md says what to change
    once the rest of the suite has passed there."""
    assert compat.JAX_VERSION == tuple(jax.__version_info__)
    assert compat.untested_jax() == ""


@pytest.fixture
def tested_0_10_and_0_11(monkeypatch):
    monkeypatch.setattr(compat, "TESTED_JAX_MINORS", ((0, 10), (0, 11)))


@pytest.mark.parametrize("version", [(0, 10, 0), (0, 10, 2), (0, 11, 2)])
def test_a_tested_minor_gets_no_note(tested_0_10_and_0_11, version):
    assert compat.untested_jax(version) == ""


@pytest.mark.parametrize("version", [(0, 12, 0), (0, 9, 2), (1, 10, 0)])
def test_an_untested_minor_gets_one_line_naming_the_tested_ones(tested_0_10_and_0_11, version):
    note = compat.untested_jax(version)
    shown = ".".join(map(str, version))
    assert note.startswith(f"jax {shown} is untested: ") and "on jax 0.10, 0.11 " in note
    assert "\n" not in note


def test_the_docs_install_only_extras_that_exist():
    text = (ROOT / "docs" / "accelerators.md").read_text()
    named = set(re.findall(r"\.\[([a-z0-9,-]+)\]", text))
    extras = {e for group in named for e in group.split(",")}
    assert set(ACCELERATOR_EXTRAS) <= extras <= set(PROJECT["optional-dependencies"])


def lower_a_triton_kernel_for_cuda() -> str:
    """A fresh one-op Pallas Triton kernel lowered for cuda (a new function each call, so
    jax's lowering caches never answer it): the program's text."""

    def add_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    call = pl.pallas_call(
        add_one,
        out_shape=jax.ShapeDtypeStruct((16, 16), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
    )
    x = jnp.zeros((16, 16), jnp.float32)
    with compat.gpu_lowering_target():
        return jax.jit(call).trace(x).lower(lowering_platforms=("cuda",)).as_text()


def test_the_triton_target_is_what_a_pallas_triton_kernel_lowers_to():
    text = lower_a_triton_kernel_for_cuda()
    assert f"@{compat.triton_custom_call_target()}(" in text


def test_jax_0_11_and_only_it_warns_that_pallas_triton_is_deprecated():
    """What each stack must see when a Triton kernel lowers: on jax 0.11 one
    DeprecationWarning that starts with the pattern the suite ignores, on jax 0.10 nothing;
    no other warning on either."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower_a_triton_kernel_for_cuda()
    pattern = compat.PALLAS_TRITON_DEPRECATION
    deprecations = [w for w in caught if str(w.message).startswith(pattern)]
    assert [w.category for w in deprecations] == [DeprecationWarning] * len(deprecations)
    assert bool(deprecations) == compat.pallas_triton_is_deprecated()
    assert [str(w.message) for w in caught if w not in deprecations] == []


@pytest.mark.parametrize(
    "version, deprecated", [((0, 10, 2), False), ((0, 11, 0), True), ((0, 11, 2), True)]
)
def test_pallas_triton_is_deprecated_from_jax_0_11(version, deprecated):
    assert compat.pallas_triton_is_deprecated(version) is deprecated


def test_python_default_filters_keep_the_deprecation_from_a_user():
    """A user's script runs under Python's default filters (DeprecationWarning shown only
    when raised from ``__main__``): jax raises it from its own code, so they never see it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        lower_a_triton_kernel_for_cuda()
    assert [str(w.message) for w in caught] == []


def test_the_suite_ignores_only_that_deprecation(pytestconfig):
    assert f"ignore:{compat.PALLAS_TRITON_DEPRECATION}:DeprecationWarning" in (
        pytestconfig.getini("filterwarnings")
    )
