"""Strict JAX settings for every test: 8 CPU devices, rank promotion raises. Text tasks'
token files go to a cache shared by the test workers (keyed by content, written atomically)."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TFMJAX_CACHE_DIR", os.path.join(tempfile.gettempdir(), "tfmjax-test-cache"))

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_numpy_rank_promotion", "raise")


SLOW_LIST = os.path.join(os.path.dirname(__file__), "slow_tests.txt")


def pytest_collection_modifyitems(config, items):
    """Mark as ``slow`` the tests listed in ``tests/slow_tests.txt`` (measured, not guessed)."""
    with open(SLOW_LIST) as f:
        listed = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    for item in items:
        if item.nodeid in listed:
            item.add_marker("slow")
