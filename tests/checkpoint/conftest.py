"""The checkpoint tests collect garbage on purpose (orbax's abandoned coroutines must report
while a test's warning filter and output capture look). A full collection walks every object
the worker holds: about 4 s a test late in a suite run. So during each test what earlier
tests left is frozen out of the collections, and the test's own objects, the coroutines
among them, are collected as before; one full collection at the end of each module takes
what a frozen object still held."""

import gc

import pytest


@pytest.fixture(autouse=True, scope="module")
def _collect_everything_once_a_module():
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _collect_only_this_tests_objects():
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
