"""kiln: JAX-style arrays, grad and jit over kiln's C++ engine.

    import kiln
    x = kiln.asarray(np.ones((2, 3), np.float32))
    loss = lambda w, x: kiln.mean(kiln.square(x @ w))
    g = kiln.jit(kiln.grad(loss))(kiln.zeros((3, 1)), x)

Arrays run eagerly (PyTorch's model), record under ``kiln.lazy()`` until a
value is read or ``kiln.mark_step`` (torch_xla's), or compile under
``kiln.jit`` (JAX's). Errors from the engine raise ``kiln.KilnError``.
"""
from . import _kiln
from ._array import (Array, Device, DType, KilnError, arange, array, asarray, bfloat16, bool_,
                     devices, dtype, float16, float32, float64, from_dlpack, full, full_like,
                     int32, int64, ones, ones_like, zeros, zeros_like)
from ._kiln import (abs, add, argmax, argsort, attention, broadcast_to, clip, concatenate, cos,
                    cpu_gemm_library, cumsum, divide, dynamic_slice, dynamic_update_slice, equal,
                    erf, exp, expm1, floor, gelu, gelu_tanh,
                    greater, greater_equal, is_lazy, layer_norm, less, less_equal, log, log1p,
                    log_softmax, logical_and, logical_not, logical_or, logical_xor,
                    matmul_precision, max, maximum, mean, minimum, multiply, neg, not_equal,
                    num_threads, one_hot, power, promote_types, relu, reshape, round, rsqrt,
                    set_matmul_precision, set_num_threads, sign, sin, slice, softmax,
                    softmax_cross_entropy, sort, sqrt, square, stop_gradient, subtract, sum,
                    sum_to, swapaxes, take, take_along_axis, tanh, top_k, where)
from ._transforms import (Jitted, eval, grad, jit, lazy, lazy_cache_stats, mark_step,
                          value_and_grad, vjp)
from . import data, models, nn, optim, random, train, tree

negative = neg
from ._kiln import adaptive_avg_pool2d, batch_norm, group_norm, min, pad  # noqa: E402


def _per_axis(v: object, axes: int, what: str) -> list:
    if isinstance(v, int):
        return [v] * axes
    v = list(v)
    if len(v) != axes:
        raise KilnError(f"{what} {v}: expected an int or {axes} ints")
    return v


def _padding(padding: object, axes: int) -> tuple:
    """PyTorch's padding forms: an int, one int per axis, "same", "valid",
    or (before, after) pairs per axis; as (pairs, same)."""
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise KilnError(f"padding '{padding}': expected 'same', 'valid', an int or pairs")
        return [], padding == "same"
    if isinstance(padding, int):
        return [(padding, padding)] * axes, False
    pads = list(padding)
    if len(pads) != axes:
        raise KilnError(f"padding {pads}: expected {axes} entries")
    return [(p, p) if isinstance(p, int) else tuple(p) for p in pads], False


def conv2d(x: Array, weight: Array, bias: object = None, stride: object = 1, padding: object = 0,
           dilation: object = 1, groups: int = 1, channels_last: bool = False) -> Array:
    """torch.nn.functional.conv2d: x [N, C, H, W] (channels_last: [N, H, W, C]),
    weight [O, C / groups, KH, KW]; padding an int, a pair, "same", "valid" or
    (before, after) pairs."""
    pads, same = _padding(padding, 2)
    y = _kiln._conv(x, weight, _per_axis(stride, 2, "stride"), pads, same,
                    _per_axis(dilation, 2, "dilation"), groups, channels_last)
    if bias is None:
        return y
    return y + (bias if channels_last else bias.reshape([-1, 1, 1]))


def conv1d(x: Array, weight: Array, bias: object = None, stride: object = 1, padding: object = 0,
           dilation: object = 1, groups: int = 1, channels_last: bool = False) -> Array:
    """torch.nn.functional.conv1d: x [N, C, L] (channels_last: [N, L, C]), weight [O, C / groups, K]."""
    pads, same = _padding(padding, 1)
    y = _kiln._conv(x, weight, _per_axis(stride, 1, "stride"), pads, same,
                    _per_axis(dilation, 1, "dilation"), groups, channels_last)
    if bias is None:
        return y
    return y + (bias if channels_last else bias.reshape([-1, 1]))


def max_pool2d(x: Array, kernel_size: object, stride: object = None, padding: object = 0,
               channels_last: bool = False) -> Array:
    """torch.nn.functional.max_pool2d (stride defaults to the window)."""
    window = _per_axis(kernel_size, 2, "kernel_size")
    stride = window if stride is None else _per_axis(stride, 2, "stride")
    return _kiln._pool(x, True, window, stride, _padding(padding, 2)[0], channels_last, True)


def avg_pool2d(x: Array, kernel_size: object, stride: object = None, padding: object = 0,
               count_include_pad: bool = True, channels_last: bool = False) -> Array:
    """torch.nn.functional.avg_pool2d (stride defaults to the window)."""
    window = _per_axis(kernel_size, 2, "kernel_size")
    stride = window if stride is None else _per_axis(stride, 2, "stride")
    return _kiln._pool(x, False, window, stride, _padding(padding, 2)[0], channels_last,
                       count_include_pad)


def astype(x: Array, dtype_: object) -> Array:
    return _kiln.astype(x, dtype(dtype_))


def transpose(x: Array, axes: object = None) -> Array:
    return x.transpose() if axes is None else x.transpose(axes)


def matmul(a: Array, b: Array, transpose_a: bool = False, transpose_b: bool = False,
           out_dtype: object = None) -> Array:
    """a @ b over the last two axes (batch axes equal, or one side rank 2);
    transpose_a/transpose_b read a stored operand as its transpose."""
    return _kiln.matmul(asarray(a), asarray(b), transpose_a, transpose_b,
                        None if out_dtype is None else dtype(out_dtype))


def synchronize(device: object = "cpu") -> None:
    """Waits until everything queued on the device has run (before reading a clock)."""
    _kiln.synchronize(device if isinstance(device, Device) else Device(str(device)))


__version__ = "0.1.0"
