"""The digits image set: a deterministic stratified split, batches pure in (seed, step)."""

import hashlib

import numpy as np
import pytest

from tfmjax.data.images import (
    TEST_EXAMPLES,
    ImageSource,
    epoch_order,
    shift_images,
    stratified_split,
)
from tfmjax.data.sources import open_source


@pytest.fixture(scope="module")
def digits():
    return open_source("digits", {})


def test_the_split_holds_out_360_test_images_stratified_and_disjoint(digits):
    train, test = digits.indices["train"], digits.indices["eval"]
    assert (len(train), len(test)) == (1437, TEST_EXAMPLES)
    assert not set(train) & set(test) and len(set(train) | set(test)) == 1797
    whole = np.bincount(digits.labels, minlength=10) / 1797
    held = np.bincount(digits.labels[test], minlength=10)
    # each class gives its share of the 360, within one image (largest remainder)
    assert np.all(np.abs(held - whole * TEST_EXAMPLES) < 1.0)


def test_the_split_is_the_same_on_every_machine(digits):
    """A hash of pixels and index orders each class, so the split is fixed by the data alone:
    this digest of the held-out indices is the same everywhere (NumPy's generators do not
    enter)."""
    digest = hashlib.sha256(np.asarray(digits.indices["eval"], np.int64).tobytes()).hexdigest()
    assert digest[:16] == EVAL_DIGEST
    again = stratified_split(digits.images, digits.labels, TEST_EXAMPLES)
    np.testing.assert_array_equal(again["eval"], digits.indices["eval"])


EVAL_DIGEST = "2bcbdd3e665647d4"


def test_pixels_are_scaled_to_the_unit_interval(digits):
    assert digits.images.shape == (1797, 8, 8, 1) and digits.images.dtype == np.float32
    assert digits.images.min() == 0.0 and digits.images.max() == 1.0
    assert digits.vocab_size == 10 and digits.label(7) == "7"


def test_batches_are_pure_in_seed_and_step(digits):
    def batch(seed, step, split="train", rows=None):
        b = digits.batch(
            batch_format="images", batch_size=16, seed=seed, step=step, split=split, rows=rows
        )
        return b["images"], b["labels"]

    fresh = ImageSource("digits", {})
    for split in ("train", "eval"):
        a = batch(0, 3, split)
        b = fresh.batch(batch_format="images", batch_size=16, seed=0, step=3, split=split)
        np.testing.assert_array_equal(a[0], b["images"])
        np.testing.assert_array_equal(a[1], b["labels"])
        assert not np.array_equal(a[0], batch(0, 4, split)[0])
        assert not np.array_equal(a[0], batch(1, 3, split)[0])
    whole, part = batch(2, 5), batch(2, 5, rows=slice(4, 10))
    np.testing.assert_array_equal(whole[0][4:10], part[0])
    np.testing.assert_array_equal(whole[1][4:10], part[1])
    assert batch(0, 0)[0].dtype == np.float32 and batch(0, 0)[1].dtype == np.int32


def test_training_batches_draw_only_training_images(digits):
    """Unshifted, every training image of a batch is one of the training split's."""
    plain = ImageSource("digits", {"shift": 0})
    train = {digits.images[i].tobytes() for i in plain.indices["train"]}
    b = plain.batch(batch_format="images", batch_size=64, seed=0, step=7)
    assert all(image.tobytes() in train for image in b["images"])


def test_each_epoch_visits_every_training_image_once():
    n, B = 50, 16
    order = np.concatenate([epoch_order(n, 0, step, B) for step in range(25)])  # 8 epochs
    for epoch in range(8):
        assert sorted(order[epoch * n : (epoch + 1) * n]) == list(range(n))
    assert not np.array_equal(order[:n], order[n : 2 * n])  # each epoch its own order


def test_shifts_move_pixels_and_fill_zeros():
    image = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1) + 1
    down_right = shift_images(image, np.array([[1, 1]]))[0, ..., 0]
    np.testing.assert_array_equal(down_right[1:, 1:], image[0, :3, :3, 0])
    assert (down_right[0] == 0).all() and (down_right[:, 0] == 0).all()
    up = shift_images(image, np.array([[-1, 0]]))[0, ..., 0]
    np.testing.assert_array_equal(up[:3], image[0, 1:, :, 0])
    assert (up[3] == 0).all()
    np.testing.assert_array_equal(shift_images(image, np.array([[0, 0]])), image)


def test_bad_params_formats_and_splits_are_refused_in_one_line(digits):
    with pytest.raises(ValueError, match="unknown parameter 'shfit'"):
        open_source("digits", {"shfit": 1})
    with pytest.raises(ValueError, match="shift=-1 is invalid"):
        open_source("digits", {"shift": -1})
    with pytest.raises(ValueError, match="serves images batches, not 'seq2seq'"):
        digits.batch(batch_format="seq2seq", batch_size=2, seed=0, step=0)
    with pytest.raises(ValueError, match="not 'length'"):
        digits.check_split("length")
