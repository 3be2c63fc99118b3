"""Counter-based random numbers in JAX's style: a key is a value, ``split``
and ``fold_in`` derive new ones, and element i of a draw depends on (key, i)
alone (Threefry-2x32), so results do not depend on threads or devices."""
from __future__ import annotations

from typing import Any

from . import _kiln
from ._array import Array, Device, _device, _shape, asarray, dtype as _dtype, float32
from ._kiln import Key

__all__ = ["Key", "key", "key_data", "split", "fold_in", "normal", "uniform", "truncated_normal",
           "bernoulli", "gamma", "beta", "randint", "categorical"]


def key(seed: int) -> Key:
    """The key of a seed (an integer below 2**64)."""
    return Key(int(seed) & 0xFFFFFFFFFFFFFFFF)


def split(key: Key, num: int = 2) -> list[Key]:
    return _kiln._split(key, num)


def fold_in(key: Key, data: int) -> Key:
    return _kiln._fold_in(key, int(data) & 0xFFFFFFFF)


def _dev(device: Any) -> Device:
    return _device(device) or Device("cpu")


def normal(key: Key, shape: Any = (), dtype: Any = float32, device: Any = None) -> Array:
    """Standard normal draws."""
    return _kiln._normal(key, _shape(shape), _dtype(dtype), _dev(device))


def uniform(key: Key, shape: Any = (), dtype: Any = float32, minval: float = 0.0,
            maxval: float = 1.0, device: Any = None) -> Array:
    """Uniform draws in [minval, maxval)."""
    return _kiln._uniform(key, _shape(shape), float(minval), float(maxval), _dtype(dtype),
                          _dev(device))


def truncated_normal(key: Key, lower: float = -2.0, upper: float = 2.0, shape: Any = (),
                     dtype: Any = float32, device: Any = None) -> Array:
    """Standard normal draws conditioned on [lower, upper]."""
    return _kiln._truncated_normal(key, _shape(shape), float(lower), float(upper), _dtype(dtype),
                                   _dev(device))


def bernoulli(key: Key, p: float = 0.5, shape: Any = (), device: Any = None) -> Array:
    """Booleans, each true with probability p."""
    return _kiln._bernoulli(key, _shape(shape), float(p), _dev(device))


def gamma(key: Key, a: float, shape: Any = (), dtype: Any = float32, device: Any = None) -> Array:
    """Gamma(a, 1) draws (jax.random.gamma with a scalar shape parameter)."""
    return _kiln._gamma(key, _shape(shape), float(a), _dtype(dtype), _dev(device))


def beta(key: Key, a: float, b: float, shape: Any = (), dtype: Any = float32,
         device: Any = None) -> Array:
    """Beta(a, b) draws: X / (X + Y) of Gamma(a) and Gamma(b) draws."""
    return _kiln._beta(key, _shape(shape), float(a), float(b), _dtype(dtype), _dev(device))


def randint(key: Key, shape: Any, minval: int, maxval: int, device: Any = None) -> Array:
    """int32 integers uniform in [minval, maxval) (jax.random.randint's order)."""
    return _kiln._randint(key, _shape(shape), int(minval), int(maxval), _dev(device))


def categorical(key: Key, logits: Any, axis: int = -1) -> Array:
    """int32 indices along ``axis`` drawn with probabilities softmax(logits)."""
    return _kiln._categorical(key, asarray(logits), int(axis))


def key_data(key: Key, device: Any = None) -> Array:
    """The key as an int32[2] array of its bits: what a jitted function takes
    as an argument so that each call draws anew (as JAX passes keys to jit)."""
    return _kiln._key_array(key, _dev(device))


def _key_operand(key: Any) -> Array | None:
    """A key as a model's apply takes it: a Key's bits, a key_data array as it
    is (inside jit), or None."""
    if isinstance(key, Key):
        return _kiln._key_array(key)
    return None if key is None else asarray(key)
