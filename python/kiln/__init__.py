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
                    cpu_gemm_library, cumsum, divide, equal, erf, exp, expm1, floor, gelu, gelu_tanh,
                    greater, greater_equal, is_lazy, layer_norm, less, less_equal, log, log1p,
                    log_softmax, logical_and, logical_not, logical_or, logical_xor,
                    matmul_precision, max, maximum, mean, minimum, multiply, neg, not_equal,
                    num_threads, one_hot, power, promote_types, relu, reshape, round, rsqrt,
                    set_matmul_precision, set_num_threads, sign, sin, slice, softmax,
                    softmax_cross_entropy, sort, sqrt, square, stop_gradient, subtract, sum,
                    sum_to, swapaxes, take, take_along_axis, tanh, top_k, where)
from ._transforms import (Jitted, eval, grad, jit, lazy, lazy_cache_stats, mark_step,
                          value_and_grad, vjp)
from . import data, nn, optim, random, train, tree

negative = neg


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
