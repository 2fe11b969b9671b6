"""Image classification data: scikit-learn's 8x8 digits (1,797 images; it ships with the
package, nothing is downloaded) behind the source interface (:mod:`tfmjax.data.sources`).

``ImageSource("digits", task_params)``: pixels 0-16 scaled to [0, 1], images ``[8, 8, 1]``,
labels 0-9. A fixed, stratified split holds out :data:`TEST_EXAMPLES` images as split
"eval" (the test set) and trains on the other 1,437: within each class the images are
ordered by a hash of their pixels and index (blake2b, the same on every machine and
version), and each class gives its share of the test set (largest remainder). Batches are a
pure function of ``(seed, step, split)`` like the toy tasks' (bit-exact resume):
  "train"  each epoch is a permutation of the training images drawn from ``(seed, epoch)``;
           batch ``step`` holds examples ``step*B .. step*B + B-1`` of that stream, each
           shifted by up to ``shift`` pixels in each direction (zeros fill in; drawn from
           ``(seed, step)``): light augmentation;
  "eval"   test images drawn at random (a look at the test set; the evaluator reads every
           test image once, in order: :meth:`ImageSource.split_arrays`).
Batch format ``images``: ``images`` float32 ``[B, 8, 8, 1]``, ``labels`` int32 ``[B]``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

import numpy as np

from tfmjax.data.base import parse_params

IMAGE_SETS = ("digits",)
IMAGE_SPLITS = ("train", "eval")
IMAGE_FORMATS = ("images",)
TEST_EXAMPLES = 360  # of 1,797: 20%, as sklearn's train_test_split(test_size=0.2) holds out
_SPLIT_CODES = {"train": 0, "eval": 1}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageParams:
    """``data.task_params`` of an image set (each checked with a one-line ValueError)."""

    shift: int = 1  # training augmentation: random shifts of up to this many pixels

    def __post_init__(self):
        if isinstance(self.shift, bool) or not isinstance(self.shift, int) or self.shift < 0:
            raise ValueError(f"shift={self.shift!r} is invalid: must be an int >= 0")

    @classmethod
    def parse(cls, params: dict[str, Any]) -> ImageParams:
        return parse_params(cls, params, "an image set")


@functools.lru_cache(maxsize=1)
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(images float32 [1797, 8, 8, 1] in [0, 1], labels int32 [1797])`` of scikit-learn's
    digits (read-only; read once per process); ValueError (one line) when scikit-learn is not
    installed."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ValueError(
            "data.task='digits' reads scikit-learn's digits: pip install scikit-learn "
            "(or tfmjax[images])"
        ) from None
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def _order_key(image: np.ndarray, index: int) -> bytes:
    """A stable sort key of one image: blake2b of its pixel bytes and its index."""
    data = np.ascontiguousarray(image, np.float32).tobytes() + int(index).to_bytes(4, "little")
    return hashlib.blake2b(data, digest_size=8).digest()


def stratified_split(images: np.ndarray, labels: np.ndarray, test: int) -> dict[str, np.ndarray]:
    """``{"train": indices, "eval": indices}`` (sorted): ``test`` images held out, each class
    its share (largest remainder), the first of the class in :func:`_order_key` order."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * test / len(labels)
    share = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - share), kind="stable")[: test - share.sum()]:
        share[i] += 1
    held = []
    for c, k in zip(classes, share, strict=True):
        members = np.flatnonzero(labels == c)
        ordered = sorted(members, key=lambda i: _order_key(images[i], i))
        held += ordered[:k]
    eval_idx = np.sort(np.asarray(held, np.int64))
    return {"train": np.setdiff1d(np.arange(len(labels)), eval_idx), "eval": eval_idx}


def shift_images(images: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """``images [B,Hi,Wi,C]`` moved by ``shifts [B,2]`` pixels (down, right; negative: up,
    left), zeros where nothing moves in."""
    B, Hi, Wi, _ = images.shape
    s = int(np.max(np.abs(shifts), initial=0))
    padded = np.pad(images, ((0, 0), (s, s), (s, s), (0, 0)))
    out = np.empty_like(images)
    for b, (dy, dx) in enumerate(shifts):
        out[b] = padded[b, s - dy : s - dy + Hi, s - dx : s - dx + Wi]
    return out


class ImageSource:
    """A labelled image set, split once, served as fixed-shape ``images`` batches."""

    digit_ids: tuple[int, ...] = ()  # labels, not digit tokens: no Abacus places
    batch_formats = IMAGE_FORMATS
    tokenizer = None  # pixels, no tokens

    def __init__(self, name: str, params: dict[str, Any]):
        if name not in IMAGE_SETS:
            raise ValueError(f"unknown image set {name!r}; image sets: {', '.join(IMAGE_SETS)}")
        self.name = name
        self.params = ImageParams.parse(params)
        self.images, self.labels = load_digits_arrays()
        self.indices = stratified_split(self.images, self.labels, TEST_EXAMPLES)
        self.num_classes = int(self.labels.max()) + 1

    @property
    def vocab_size(self) -> int:
        """Classes; the model's ``vocab_size`` (its logits) must be at least this."""
        return self.num_classes

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])

    def label(self, i: int) -> str:
        """The name of class ``i`` (a digit)."""
        return str(i)

    def check_split(self, split: str) -> None:
        if split not in IMAGE_SPLITS:
            raise ValueError(
                f"an image set has splits {', '.join(IMAGE_SPLITS)} (eval: the held-out test "
                f"images), not {split!r}"
            )

    def split_arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Every image and label of ``split``, in index order."""
        self.check_split(split)
        idx = self.indices[split]
        return self.images[idx], self.labels[idx]

    def batch(
        self,
        *,
        batch_format: str,
        batch_size: int,
        seed: int,
        step: int,
        split: str = "train",
        rows: slice | None = None,
    ) -> dict[str, np.ndarray]:
        """Batch ``step`` of stream ``seed`` (see the module docstring); ``rows``: only those
        rows of it (a process's share), equal to the whole batch's."""
        if batch_format not in IMAGE_FORMATS:
            raise ValueError(
                f"an image set serves {', '.join(IMAGE_FORMATS)} batches, not {batch_format!r}"
            )
        self.check_split(split)
        idx = self.indices[split]
        if split == "train":
            picked = idx[epoch_order(len(idx), seed, step, batch_size)]
        else:
            rng = np.random.default_rng([int(seed), int(step), _SPLIT_CODES[split]])
            picked = idx[rng.integers(0, len(idx), size=batch_size)]
        images = self.images[picked]
        if split == "train" and self.params.shift:
            rng = np.random.default_rng([int(seed), int(step), _SPLIT_CODES[split], 1])
            s = self.params.shift
            images = shift_images(images, rng.integers(-s, s + 1, size=(batch_size, 2)))
        rows = slice(None) if rows is None else rows
        return {"images": images[rows], "labels": self.labels[picked][rows]}

    def assets(self) -> dict:
        return {}  # the set ships with scikit-learn: nothing to keep


def epoch_order(n: int, seed: int, step: int, batch_size: int) -> np.ndarray:
    """Positions ``[batch_size]`` in ``0..n-1`` of batch ``step``: examples ``step*B ..
    step*B + B-1`` of a stream where each epoch is a permutation drawn from ``(seed, epoch)``."""
    first = int(step) * batch_size
    out = np.empty(batch_size, np.int64)
    for epoch in range(first // n, (first + batch_size - 1) // n + 1):
        perm = np.random.default_rng([int(seed), epoch, 2]).permutation(n)
        lo, hi = max(first, epoch * n), min(first + batch_size, (epoch + 1) * n)
        out[lo - first : hi - first] = perm[lo - epoch * n : hi - epoch * n]
    return out
