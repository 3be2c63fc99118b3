"""The layers kiln's model families are built of, as classes over parameter
trees (Flax's style, without its magic): a layer holds its sizes;
``init(key)`` returns its parameters as a dict; ``apply(params, x, ...)``
computes from them; nothing is stored in the layer.

    fc = kiln.nn.Linear(768, 3072)
    params = fc.init(kiln.random.key(0))      # {"weight": [3072, 768], "bias": [3072]}
    y = fc.apply(params, x)

A layer's parameter names follow PyTorch's ("weight", "bias"); ``name``
prefixes them ("encoder.fc" holds "encoder.fc.weight"), so that layers
share one tree, as transformers' models do. BatchNorm2d also has a state
(its running statistics): ``init_state()``, and ``apply`` takes and returns
it. Dropout and DropPath draw from ``key`` (a Key, or its
kiln.random.key_data array inside jit) in training; each call of a layer in
one ``apply`` is its own random site.
"""
from __future__ import annotations

from typing import Any

from .. import _kiln
from .._array import Array, Device, _device, _precision_dtype, asarray
from .._kiln import KilnError, Layout
from ..random import Key, _key_operand

__all__ = ["Init", "Linear", "Conv2d", "LayerNorm", "BatchNorm2d", "Embedding", "Dropout",
           "DropPath", "MultiHeadAttention", "MLP"]

Init = _kiln._Init
"""How a parameter starts: ``Init.normal(std)``, ``Init.truncated_normal(std)``
(cut at ±2, as torch's trunc_normal_), ``Init.uniform(bound)``,
``Init.kaiming_normal_fan_out(fan_out)``, ``Init.torch_default(fan_in)``
(uniform ±1/√fan_in), ``Init.zeros()``, ``Init.ones()``, ``Init.constant(v)``."""



def _pair(v: Any, what: str) -> tuple:
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2:
        raise KilnError(f"[nn] {what} {v!r}: expected an integer or a (height, width) pair")
    return v


class _Layer:
    """What every layer shares: its parameters' names and shapes, init, and
    apply through kiln's C++ layer."""

    _native: Any
    _stateful = False

    def parameter_shapes(self) -> dict:
        """{name: shape} of the parameters, in declaration order."""
        return {n: tuple(s) for n, s in self._native.declarations()}

    def init(self, key: Key, device: Any = None) -> dict:
        """The parameters, drawn from ``key`` on ``device`` (parameter i
        from fold_in(key, i): the same numbers on every device)."""
        return self._native.init(key, _device(device) or Device("cpu"))

    def _apply(self, params: dict, x: Any, state: dict | None, *, train: bool = False,
               drop: bool = True, key: Any = None, layout: str = "NCHW",
               out_layout: str | None = None, precision: str = "fp32",
               fused_attention: bool = True, inference: bool = False) -> tuple:
        return self._native.apply(params, state or {}, asarray(x), getattr(Layout, layout),
                                  getattr(Layout, out_layout or layout), train, drop,
                                  _key_operand(key), _precision_dtype(precision),
                                  fused_attention, inference)

    def apply(self, params: dict, x: Any, **options: Any) -> Array:
        """The layer's output. Options: ``train`` (dropout and drop path on,
        drawn from ``key``), ``key``, ``precision`` ("fp32" or "bf16": the
        matmuls' operands rounded to bf16), ``inference``, and for
        convolutions ``layout``/``out_layout`` ("NCHW" or "NHWC")."""
        return self._apply(params, x, None, **options)[0]

    __call__ = apply

    def __repr__(self) -> str:
        fields = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


class Linear(_Layer):
    """torch.nn.Linear: y = x·Wᵀ + b, W [out_features, in_features].
    ``weight_init``: Init.normal(0.02) unless given (transformers' default);
    ``Init.torch_default(in_features)`` is torch's."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, name: str = "",
                 weight_init: Any = None, bias_init: Any = None):
        self.in_features, self.out_features, self.bias, self.name = (
            int(in_features), int(out_features), bool(bias), name)
        n = self._native = _kiln._Linear()
        n.name, n.in_features, n.out_features, n.bias = name, self.in_features, self.out_features, self.bias
        if weight_init is not None:
            n.weight_init = weight_init
        if bias_init is not None:
            n.bias_init = bias_init


class Conv2d(_Layer):
    """torch.nn.Conv2d: weight [out, in / groups, kh, kw]; ``padding`` an
    integer, a (height, width) pair, or "same". ``apply(..., layout=)``
    takes NCHW (default) or NHWC inputs; ``out_layout`` may differ.
    ``patch_matmul``: computed as one matmul over non-overlapping patches
    (stride = kernel, no padding; a ViT's patch embedding), in the apply's
    precision."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True, *,
                 name: str = "", weight_init: Any = None, bias_init: Any = None,
                 patch_matmul: bool = False):
        self.in_channels, self.out_channels, self.name = int(in_channels), int(out_channels), name
        self.kernel_size, self.stride = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
        self.dilation, self.groups, self.bias, self.padding = (
            _pair(dilation, "dilation"), int(groups), bool(bias), padding)
        n = self._native = _kiln._Conv2d()
        n.name, n.in_channels, n.out_channels = name, self.in_channels, self.out_channels
        n.kernel_size, n.stride, n.dilation = self.kernel_size, self.stride, self.dilation
        n.groups, n.bias, n.patch_matmul = self.groups, self.bias, bool(patch_matmul)
        if padding == "same":
            n.same = True
        elif padding == "valid":
            pass
        else:
            ph, pw = _pair(padding, "padding")
            if ph or pw:
                n.padding = [(ph, ph), (pw, pw)]
        if weight_init is not None:
            n.weight_init = weight_init
        if bias_init is not None:
            n.bias_init = bias_init


class LayerNorm(_Layer):
    """torch.nn.LayerNorm over the last axis, or over axis 1 of [N, C, ...]
    with ``channels_first`` (transformers' ConvNext data_format)."""

    def __init__(self, dim: int, eps: float = 1e-5, *, channels_first: bool = False,
                 name: str = ""):
        self.dim, self.eps, self.channels_first, self.name = int(dim), float(eps), channels_first, name
        n = self._native = _kiln._LayerNorm()
        n.name, n.dim, n.eps, n.channels_first = name, self.dim, self.eps, channels_first


class BatchNorm2d(_Layer):
    """torch.nn.BatchNorm2d. ``apply(params, x, state=..., train=...)``
    returns ``(y, new_state)``: in training the batch's statistics
    normalize and the running ones move by ``momentum``; in evaluation the
    running ones normalize."""

    _stateful = True

    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.1, *, name: str = ""):
        self.dim, self.eps, self.momentum, self.name = int(dim), float(eps), float(momentum), name
        n = self._native = _kiln._BatchNorm()
        n.name, n.dim, n.eps, n.momentum = name, self.dim, self.eps, self.momentum

    def init_state(self, device: Any = None) -> dict:
        """running_mean 0, running_var 1, num_batches_tracked 0."""
        return self._native.init_state(_device(device) or Device("cpu"))

    def apply(self, params: dict, x: Any, state: dict | None = None, **options: Any) -> tuple:
        return self._apply(params, x, state if state is not None else self.init_state(), **options)

    __call__ = apply


class Embedding(_Layer):
    """torch.nn.Embedding: weight [num_embeddings, dim] read at integer ids."""

    def __init__(self, num_embeddings: int, dim: int, *, name: str = "", init: Any = None):
        self.num_embeddings, self.dim, self.name = int(num_embeddings), int(dim), name
        n = self._native = _kiln._Embedding()
        n.name, n.num_embeddings, n.dim = name, self.num_embeddings, self.dim
        if init is not None:
            n.init_ = init


class Dropout(_Layer):
    """Inverted dropout with probability ``p`` (in training, with a key)."""

    def __init__(self, p: float = 0.5):
        self.p = float(p)
        self._native = _kiln._Dropout()
        self._native.p = self.p


class DropPath(_Layer):
    """Stochastic depth: whole examples (axis 0) dropped with probability ``p``."""

    def __init__(self, p: float = 0.0):
        self.p = float(p)
        self._native = _kiln._DropPath()
        self._native.p = self.p


class MultiHeadAttention(_Layer):
    """Self-attention over x [B, T, dim] with ``heads`` heads of ``head_dim``
    (dim / heads unless given): query, key, value and output Linears (named
    by ``names``), softmax(QKᵀ/√head_dim)·V; ``dropout`` on the
    probabilities in training. ``apply(..., fused_attention=True)`` runs
    kiln's fused attention kernel."""

    def __init__(self, dim: int, heads: int, head_dim: int | None = None, *, qkv_bias: bool = True,
                 dropout: float = 0.0, name: str = "",
                 names: tuple = ("query", "key", "value", "output"), weight_init: Any = None):
        if head_dim is None:
            if dim % heads:
                raise KilnError(f"[nn.MultiHeadAttention] dim {dim} is not a multiple of heads {heads}")
            head_dim = dim // heads
        self.dim, self.heads, self.head_dim, self.qkv_bias, self.dropout, self.name = (
            int(dim), int(heads), int(head_dim), bool(qkv_bias), float(dropout), name)
        n = self._native = _kiln._MultiHeadAttention()
        n.query, n.key, n.value, n.output = (f"{name}.{x}" if name else x for x in names)
        n.dim, n.heads, n.head_dim, n.qkv_bias, n.dropout = (
            self.dim, self.heads, self.head_dim, self.qkv_bias, self.dropout)
        if weight_init is not None:
            n.weight_init = weight_init


class MLP(_Layer):
    """Linear(dim, hidden), the activation (transformers' names: "gelu",
    "relu", "gelu_new", ...), Linear(hidden, dim); named ``names``."""

    def __init__(self, dim: int, hidden: int, activation: str = "gelu", *, name: str = "",
                 names: tuple = ("fc1", "fc2"), weight_init: Any = None):
        self.dim, self.hidden, self.activation, self.name = int(dim), int(hidden), activation, name
        up = Linear(dim, hidden, name=f"{name}.{names[0]}" if name else names[0],
                    weight_init=weight_init)
        down = Linear(hidden, dim, name=f"{name}.{names[1]}" if name else names[1],
                      weight_init=weight_init)
        n = self._native = _kiln._MLP()
        n.up, n.down, n.activation = up._native, down._native, activation
