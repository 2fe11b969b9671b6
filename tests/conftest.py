"""Strict JAX settings for every test: 8 CPU devices, rank promotion raises. Text tasks'
token files go to a cache shared by the test workers (keyed by content, written atomically).

Compiled programs go to a JAX persistent compilation cache of this run's own (shared by its
xdist workers and the train.py/eval.py subprocesses the tests start, empty at the start of
each run, removed at its end): many tests build the same small model and jit the same step
anew, and XLA's compile dominates their time. A cache hit loads the same executable, so
values are unchanged; tests that count compilations count traces, which still happen.
``make test`` compiles with ``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` (see the Makefile): most of
its tests are small programs that compile in more time than they run. The fast tests of
``tests/kernels`` and ``tests/layers``, which compare the kernels and layers with their
references, still compile what users compile (:func:`_kernels_compile_like_users`); a run
without the variable compiles everything so."""

import gc
import importlib.util
import json
import os
import shutil
import tempfile
import uuid
import zlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TFMJAX_CACHE_DIR", os.path.join(tempfile.gettempdir(), "tfmjax-test-cache"))
JIT_CACHE_ROOT = os.path.join(tempfile.gettempdir(), "tfmjax-test-jit-cache")
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(JIT_CACHE_ROOT, _RUN))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402  (must come after XLA_FLAGS)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


SLOW_LIST = os.path.join(os.path.dirname(__file__), "slow_tests.txt")
MODULE_SECONDS = os.path.join(os.path.dirname(__file__), "module_seconds.json")
_TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "test_seconds.py")
_spec = importlib.util.spec_from_file_location("test_seconds", _TOOL)
test_seconds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_seconds)  # listed_id: a test's id as the slow list has it
_spec = importlib.util.spec_from_file_location(
    "random_params", os.path.join(os.path.dirname(__file__), "random_params.py")
)
_random_params = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_random_params)


def pytest_configure(config):
    """jax 0.11 warns on every Pallas Triton lowering that the backend is deprecated (the
    kernel's port is tfmjax's own work, nothing a test can act on): the suite ignores that
    one warning, by the pattern of ``tfmjax.compat``, and shows every other."""
    from tfmjax import compat

    config.addinivalue_line(
        "filterwarnings", f"ignore:{compat.PALLAS_TRITON_DEPRECATION}:DeprecationWarning"
    )


def pytest_collection_modifyitems(config, items):
    """Mark as ``slow`` the tests listed in ``tests/slow_tests.txt`` (measured, not guessed;
    not with ``TFMJAX_SLOW_LIST=off``, which ``make mutate`` sets for its targets' tests),
    and hand the workers the longest modules first (``tests/module_seconds.json``, measured by
    ``tools/test_seconds.py``; a module's tests stay together and in order): a long module no
    longer starts last and leaves one worker running alone.

    Each test is its own work unit, so a module's tests alternate between the two workers and
    both build its module fixtures. Putting each module in an xdist group of its own ran a
    384-test subset 10% faster, but when a worker crashed (a segfault inside XLA's compile,
    once) xdist's scope scheduler requeued the whole module and the run hung."""
    with open(SLOW_LIST) as f:
        listed = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    if os.environ.get("TFMJAX_SLOW_LIST") == "off":  # make mutate: every fast test of a file
        listed = set()
    with open(MODULE_SECONDS) as f:
        seconds = json.load(f)
    for item in items:
        if test_seconds.listed_id(item.nodeid) in listed:
            item.add_marker("slow")
    order = {}
    for item in items:
        order.setdefault(item.nodeid.split("::")[0], len(order))
    items.sort(key=lambda item: (-seconds.get(m := item.nodeid.split("::")[0], 0.0), order[m]))


MAPS = "/proc/self/maps"
MAX_MAPS = "/proc/sys/vm/max_map_count"


def _map_limit() -> int | None:
    """Half the kernel's limit on a process's memory mappings (None where there is none)."""
    try:
        with open(MAX_MAPS) as f:
            return int(f.read()) // 2
    except (OSError, ValueError):
        return None


# None where /proc/self/maps is missing (not Linux): nothing to count, nothing to clear
_MAP_LIMIT = (
    int(os.environ.get("TFMJAX_TEST_MAP_LIMIT", "0")) or _map_limit()
    if os.path.exists(MAPS)
    else None
)
_TESTS_RUN = [0]


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Random numbers of this test's own, seeded by its id: the same draws whatever ran
    before it in its xdist worker (a module-wide generator gave each test other inputs
    from run to run, and one draw made a cancelling sum fail a relative tolerance in CI)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def random_params():
    """``random_params(model, seed=0, embed_scale=0.2)``: a model's params drawn on the host
    (``tests/random_params.py``), for tests whose assertions hold for any params: compiling
    ``model.init`` costs a tiny model ~2.5-5 s (its random draws), more than most tests."""
    return _random_params.random_params


@pytest.fixture(scope="session")
def script_main():
    """``script_main("train")``: the ``main(argv)`` of the repository's ``train.py`` (or
    ``eval.py``), loaded as a module, for command-line tests that run in-process."""

    def load(name: str):
        path = os.path.join(os.path.dirname(__file__), "..", f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_{name}_cli", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main

    return load


COMPILED_LIKE_USERS = ("tests/kernels/", "tests/layers/")


@pytest.fixture(autouse=True)
def _kernels_compile_like_users(request):
    """Full optimization for the fast tests under :data:`COMPILED_LIKE_USERS` when the run
    turns most optimizations off (``make test-fast``): the fast half then compares with the
    references what users compile, at 26% less time for the rest (3 min 29 s against
    4 min 42 s for 540 tests, 2026-12-02). The slow tests keep the run's setting, so both
    levels are tested. (jax's in-memory caches do not key on the flag: a program another
    test of the worker compiled first is reused as it was compiled.)"""
    rel = os.path.relpath(str(request.node.path), os.path.dirname(os.path.dirname(__file__)))
    wanted = rel.replace(os.sep, "/").startswith(COMPILED_LIKE_USERS)
    flag = "jax_disable_most_optimizations"
    if not (wanted and jax.config.read(flag)) or request.node.get_closest_marker("slow"):
        yield
        return
    jax.config.update(flag, False)
    try:
        yield
    finally:
        jax.config.update(flag, True)


@pytest.fixture(autouse=True)
def _release_compiled_programs_before_the_mapping_limit():
    """Each executable XLA:CPU compiles holds memory mappings of its own, and jax's caches
    keep them alive: late in a suite run, when one worker crashed (a segfault inside XLA's
    compile or compilation-cache write, twice at 98% of a run), the other held 56,685 of the
    kernel's 65,530 (``vm.max_map_count``). Every 10th test, a worker over
    half the limit drops jax's caches and collects what they held; what runs again comes
    back from the run's compilation cache."""
    yield
    _TESTS_RUN[0] += 1
    if _MAP_LIMIT is None or _TESTS_RUN[0] % 10:
        return
    with open(MAPS, "rb") as f:
        mappings = f.read().count(b"\n")
    if mappings > _MAP_LIMIT:
        jax.clear_caches()
        gc.collect()


def pytest_sessionfinish(session, exitstatus):
    """The run's compilation cache goes with the run (the xdist controller, or a plain run)."""
    if not hasattr(session.config, "workerinput"):
        cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
        if os.path.dirname(cache) == JIT_CACHE_ROOT:
            shutil.rmtree(cache, ignore_errors=True)
