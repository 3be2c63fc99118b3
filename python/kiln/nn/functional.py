"""Neural-network functions over kiln arrays, fused where kiln has a fused
kernel (softmax, LayerNorm, softmax cross-entropy, attention)."""
from __future__ import annotations

from typing import Any

from .. import _kiln
from .._array import Array, asarray, dtype as _dtype, float32

relu = _kiln.relu
gelu = _kiln.gelu
gelu_tanh = _kiln.gelu_tanh
tanh = _kiln.tanh
softmax = _kiln.softmax
log_softmax = _kiln.log_softmax
attention = _kiln.attention

__all__ = ["relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "softmax", "log_softmax", "layer_norm",
           "linear", "one_hot", "cross_entropy", "softmax_cross_entropy", "attention"]


def sigmoid(x: Array) -> Array:
    return 0.5 * _kiln.tanh(0.5 * x) + 0.5


def layer_norm(x: Array, weight: Array | None = None, bias: Array | None = None,
               eps: float = 1e-5) -> Array:
    """LayerNorm over the last axis (PyTorch's F.layer_norm over it)."""
    return _kiln.layer_norm(x, weight, bias, eps)


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    """x @ weight.T + bias, with PyTorch's [out, in] weight (F.linear)."""
    y = _kiln.matmul(x, weight, transpose_b=True)
    return y if bias is None else y + bias


def one_hot(labels: Any, num_classes: int, dtype: Any = float32) -> Array:
    return _kiln.one_hot(asarray(labels), int(num_classes), _dtype(dtype))


def softmax_cross_entropy(logits: Array, labels: Any) -> Array:
    """Per-example softmax cross-entropy of logits [..., C] and integer labels [...]."""
    return _kiln.softmax_cross_entropy(logits, asarray(labels))


def cross_entropy(logits: Array, labels: Any, reduction: str = "mean") -> Array:
    """PyTorch's F.cross_entropy for integer labels: 'mean', 'sum' or 'none'."""
    per = softmax_cross_entropy(logits, labels)
    if reduction == "mean":
        return _kiln.mean(per)
    if reduction == "sum":
        return _kiln.sum(per)
    if reduction == "none":
        return per
    raise ValueError(f"cross_entropy: reduction {reduction!r}; expected 'mean', 'sum' or 'none'")
