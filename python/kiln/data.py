"""Data: kiln's data sets (random images, Fashion-MNIST, image folders) and
data sets written in Python, batched by kiln's threaded loader with
prefetch, which iterates as PyTorch's DataLoader does (an epoch per loop).

    class Squares(kiln.data.Dataset):
        image_shape = (1, 4, 4)
        def __len__(self): return 100
        def __getitem__(self, i): return np.full((1, 4, 4), i, np.float32), i % 2

    for images, labels in kiln.data.Loader(Squares(), batch_size=10, shuffle=True):
        ...
"""
from __future__ import annotations

import atexit
import weakref
from typing import Any, Iterator, NamedTuple, Sequence

from . import _kiln
from ._array import Array
from ._kiln import Layout

__all__ = ["Dataset", "RandomImages", "FashionMNIST", "ImageFolder", "Loader", "Batch",
           "Tokenizer"]


class Tokenizer:
    """GPT-2's tokenizer (byte-level BPE, as HuggingFace tokenizers runs it),
    read from a checkpoint's tokenizer.json or vocab.json + merges.txt.

        tok = kiln.data.Tokenizer.from_folder("path/to/gpt2")
        ids = tok.encode("Hello world")   # [15496, 995]
        text = tok.decode(ids)
    """

    def __init__(self, native: Any):
        self._t = native

    @classmethod
    def from_folder(cls, directory: Any) -> "Tokenizer":
        """A folder's tokenizer.json, else its vocab.json and merges.txt."""
        import os
        return cls(_kiln._Tokenizer.from_folder(os.fspath(directory)))

    @classmethod
    def from_file(cls, path: Any) -> "Tokenizer":
        """A tokenizer.json file."""
        import os
        return cls(_kiln._Tokenizer.from_json_file(os.fspath(path)))

    def encode(self, text: str) -> list:
        """The ids of ``text``."""
        return list(self._t.encode(text))

    def decode(self, ids: Any) -> str:
        """The text of ``ids`` (a list, or an array of one row); bytes that
        do not form UTF-8 (a token cut mid-character) are replaced."""
        import numpy as np
        flat = [int(i) for i in np.asarray(ids).reshape(-1)]
        return self._t.decode(flat).decode("utf-8", errors="replace")

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    def token_id(self, token: str) -> int | None:
        """The id of a token (``"<|endoftext|>"``), or None."""
        return self._t.token_id(token)

    def __repr__(self) -> str:
        return f"kiln.data.Tokenizer({self._t.origin}, {self.vocab_size} tokens)"


class Dataset:
    """A data set written in Python: define ``image_shape`` (one sample's
    shape, e.g. (3, 224, 224)), ``__len__`` and ``__getitem__(index)``
    returning ``(image, label)``: an array of image_shape's size (converted
    to float32) and an integer. Define ``get_epoch(index, epoch)`` instead of
    ``__getitem__`` for augmentations that change per epoch. kiln's loader
    calls it from its worker threads, under the GIL."""

    image_shape: Sequence[int] = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[Any, int]:
        raise NotImplementedError


class _Native:
    """A data set of kiln's own (C++), indexable from Python."""

    def __init__(self, native: Any):
        self._native = native

    def __len__(self) -> int:
        return len(self._native)

    @property
    def image_shape(self) -> tuple:
        return self._native.image_shape

    def __getitem__(self, index: int) -> tuple[Array, int]:
        return self._native[index]


class RandomImages(_Native):
    """The reference experiment's data: N(0, 1) images, label of sample i is
    i % num_labels."""

    def __init__(self, num_samples: int = 1 << 20, num_labels: int = 1000, image_size: Any = 224,
                 channels: int = 3, layout: str = "NCHW", seed: int = 0):
        super().__init__(_kiln._random_images(num_samples, num_labels, image_size, channels,
                                              getattr(Layout, layout), seed))


class FashionMNIST(_Native):
    """Fashion-MNIST (Debian's dataset-fashion-mnist), normalized with the
    training split's mean and std; ``hflip`` adds random horizontal flips."""

    classes = property(lambda self: _kiln._fashion_mnist_classes())

    def __init__(self, split: str = "train", root: str | None = None, layout: str = "NCHW",
                 hflip: bool = False, seed: int = 0):
        super().__init__(_kiln._fashion_mnist(root or _kiln._fashion_mnist_dir(), split,
                                              getattr(Layout, layout), hflip, seed))


class ImageFolder(_Native):
    """``root/<class>/<image>.{jpg,jpeg,png}``, decoded as Pillow decodes:
    ``split`` "all", "train" (all but every 10th file of each class) or
    "holdout" (those); ``augment``: random crops and flips."""

    def __init__(self, root: str, split: str = "all", image_size: Any = 224, channels: int = 3,
                 augment: bool = False, layout: str = "NCHW", seed: int = 0):
        native, classes = _kiln._image_folder(str(root), split, image_size, channels, augment,
                                              getattr(Layout, layout), seed)
        super().__init__(native)
        self.classes = classes


class Batch(NamedTuple):
    images: Array  # [B, ...image_shape] float32
    labels: Array  # [B] int32
    epoch: int
    index: int  # the batch's number within its epoch


class Loader:
    """Batches of a data set, made ahead by ``workers`` threads (``prefetch``
    batches at most). ``for batch in loader`` runs one epoch; ``next(loader)``
    the next batch whatever its epoch. ``shuffle`` draws each epoch's order
    from (seed, epoch)."""

    def __init__(self, dataset: Any, batch_size: int = 32, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = True, workers: int = 2, prefetch: int = 4, start: int = 0,
                 limit: int = 0):
        native = dataset._native if isinstance(dataset, _Native) else _kiln._python_dataset(dataset)
        self.dataset = dataset
        self.limit = limit
        self._loader = _kiln._Loader(native, batch_size, shuffle, seed, drop_last, workers,
                                     prefetch, start, limit)
        self._per = self._loader.batches_per_epoch
        _open.add(self)

    def close(self) -> None:
        """Stops the worker threads (also done when the loader is freed, and
        at interpreter exit)."""
        self._loader = None

    @property
    def batches_per_epoch(self) -> int:
        return self._per

    def __len__(self) -> int:
        return self.batches_per_epoch

    @property
    def wait_seconds(self) -> float:
        """Seconds the consumer has waited for batches so far."""
        return 0.0 if self._loader is None else self._loader.wait_seconds

    def __next__(self) -> Batch:
        if self._loader is None:
            raise StopIteration
        if self.limit and self._loader.position >= self.limit:
            raise StopIteration
        return Batch(*self._loader.next())

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch (after a ``break``, the next loop
        finishes the epoch it left), up to ``limit`` batches in all."""
        if self._loader is None or self._per == 0:
            return
        left = self._per - self._loader.position % self._per
        if self.limit:
            left = min(left, self.limit - self._loader.position)
        for _ in range(left):
            if self._loader is None:  # closed meanwhile
                return
            yield Batch(*self._loader.next())


# Loaders still open at exit are closed while Python can still run their
# worker threads' calls into a Python data set.
_open: "weakref.WeakSet[Loader]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for loader in list(_open):
        loader.close()
