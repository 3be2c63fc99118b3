"""kiln.Array's Python side: dtypes, creation, numpy and DLPack interop,
and the methods of kiln.Array written in Python (indexing, the numpy and
DLPack protocols, the forms that take Python's dtypes, devices and shapes).
The class itself is defined once, in python/src/arrays.cpp, whose methods
of those names call the functions here."""
from __future__ import annotations

import builtins
import operator
from typing import Any, Sequence

import numpy as np

from . import _kiln
from ._kiln import Array, Device, DType, KilnError

float32 = DType.float32
float64 = DType.float64
bfloat16 = DType.bfloat16
float16 = DType.float16
int32 = DType.int32
int64 = DType.int64
bool_ = DType.bool_

try:  # numpy's bfloat16, as JAX uses it
    import ml_dtypes

    _np_bfloat16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    _np_bfloat16 = None

_BY_NAME = {
    "float32": float32, "f32": float32, "float": float32,
    "float64": float64, "f64": float64, "double": float64,
    "bfloat16": bfloat16, "bf16": bfloat16,
    "float16": float16, "f16": float16, "half": float16,
    "int32": int32, "i32": int32,
    "int64": int64, "i64": int64,
    "bool": bool_, "bool_": bool_,
}
_TO_NUMPY = {float32: np.dtype(np.float32), float64: np.dtype(np.float64),
             float16: np.dtype(np.float16), int32: np.dtype(np.int32),
             int64: np.dtype(np.int64), bool_: np.dtype(np.bool_)}
if _np_bfloat16 is not None:
    _TO_NUMPY[bfloat16] = _np_bfloat16


def dtype(d: Any) -> DType:
    """A kiln dtype from a kiln dtype, a name ('float32', 'bf16'), a numpy
    dtype or a Python type (float: float32, int: int32, bool: bool)."""
    if isinstance(d, DType):
        return d
    if d is float:
        return float32
    if d is int:
        return int32
    if d is bool:
        return bool_
    if isinstance(d, str) and d in _BY_NAME:
        return _BY_NAME[d]
    try:
        nd = np.dtype(d)
    except TypeError:
        nd = None
    if nd is not None:
        if _np_bfloat16 is not None and nd == _np_bfloat16:
            return bfloat16
        if nd.name in _BY_NAME:
            return _BY_NAME[nd.name]
    raise KilnError(f"[dtype] {d!r} is not a kiln dtype (float32, float64, bfloat16, float16, "
                    "int32, int64, bool)")


_to_dtype = dtype  # for functions whose parameter is named dtype


def _device(d: Any) -> Device | None:
    if d is None or isinstance(d, Device):
        return d
    return Device(str(d))


def _precision_dtype(precision: str) -> DType:
    """The matmul operands' dtype of a model's ``precision``: "fp32" or "bf16"."""
    if precision == "fp32":
        return float32
    if precision == "bf16":
        return dtype("bfloat16")
    raise KilnError(f"[apply] precision {precision!r}: expected fp32 or bf16")


def devices() -> list[Device]:
    """The devices this process can use: cpu, ref (the reference backend) and
    each CUDA GPU."""
    return [Device("cpu"), Device("ref")] + [Device(f"cuda:{i}")
                                             for i in range(_kiln.cuda_device_count())]


def _shape(shape: Any) -> list[int]:
    if isinstance(shape, (int, np.integer)):
        return [int(shape)]
    return [int(s) for s in shape]


# ---- creation ----------------------------------------------------------------

def _from_numpy(x: np.ndarray, device: Device | None) -> Array:
    if not x.flags.c_contiguous:
        x = x.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    if _np_bfloat16 is not None and x.dtype == _np_bfloat16:
        return _kiln._from_ndarray(x.view(np.uint16), device, bfloat16)
    if x.dtype.kind not in "fib" or x.dtype.name not in _BY_NAME:
        raise KilnError(f"[asarray] numpy arrays of {x.dtype} are not supported; kiln holds "
                        "float32, float64, bfloat16, float16, int32, int64 and bool (convert "
                        "with x.astype(np.float32) or np.int32)")
    return _kiln._from_ndarray(x, device)


_INT32 = np.iinfo(np.int32)


def _python_values(x: Any, d: Any) -> np.ndarray:
    """Python numbers and nested lists as numpy: in dtype ``d`` when given,
    else as JAX takes them (float: float32, int: int32 when it fits, bool)."""
    if d is not None:
        return np.asarray(x, dtype=_TO_NUMPY[dtype(d)])
    n = np.asarray(x)
    if n.dtype == np.float64:
        return n.astype(np.float32)
    if n.dtype == np.int64:
        if n.size and (n.min() < _INT32.min or n.max() > _INT32.max):
            raise KilnError("[asarray] integers beyond int32's range: give dtype=kiln.int64")
        return n.astype(np.int32)
    return n


def asarray(x: Any, dtype: Any = None, device: Any = None) -> Array:
    """``x`` as a kiln array: a kiln Array as it is (converted when dtype or
    device say so); a numpy array, or anything with ``__dlpack__``, copied in
    its own dtype; Python numbers and nested lists as JAX takes them (float:
    float32, int: int32, bool: bool)."""
    dev = _device(device)
    if isinstance(x, Array):
        a = x
    elif isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = _from_numpy(np.asarray(x), dev)
    elif hasattr(x, "__dlpack__") and not isinstance(x, (builtins.list, tuple)):
        a = from_dlpack(x, device=dev)
    else:
        a = _from_numpy(_python_values(x, dtype), dev)
    if dtype is not None and a.dtype != _to_dtype(dtype):
        a = _kiln.astype(a, _to_dtype(dtype))
    if dev is not None and a.device != dev:
        a = a.to(dev)
    return a


def array(x: Any, dtype: Any = None, device: Any = None) -> Array:
    """A new kiln array holding a copy of ``x`` (see ``asarray``)."""
    if isinstance(x, Array):
        x = np.asarray(x) if x.device.type != "cuda" else x
    return asarray(x, dtype, device)


def from_dlpack(x: Any, device: Any = None) -> Array:
    """A kiln array holding a copy of any array that exports ``__dlpack__``
    (PyTorch, JAX, numpy, CuPy), host or CUDA memory; on the array's own
    device unless ``device`` says otherwise."""
    dev = _device(device)
    if isinstance(x, np.ndarray):
        return _from_numpy(x, dev)
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        kind, index = x.__dlpack_device__()
        if int(kind) == _DLPACK_CUDA:
            # The producer orders its pending writes before kiln's stream,
            # which the copy then runs on (the DLPack stream protocol).
            stream = _kiln._stream(Device(f"cuda:{int(index)}"))
            return _kiln._from_ndarray(x.__dlpack__(stream=stream), dev)
    return _kiln._from_ndarray(x, dev)


_DLPACK_CPU, _DLPACK_CUDA = 1, 2  # DLPack's kDLCPU and kDLCUDA


def zeros(shape: Any, dtype: Any = float32, device: Any = None) -> Array:
    """An array of zeros (shape: an int or a tuple)."""
    return _kiln.zeros(_shape(shape), _to_dtype(dtype), _device(device) or Device("cpu"))


def ones(shape: Any, dtype: Any = float32, device: Any = None) -> Array:
    """An array of ones (shape: an int or a tuple)."""
    return _kiln.ones(_shape(shape), _to_dtype(dtype), _device(device) or Device("cpu"))


def full(shape: Any, fill_value: float, dtype: Any = None, device: Any = None) -> Array:
    """An array filled with fill_value; its dtype by default that of the
    Python value (bool, int32 or float32)."""
    if dtype is None:
        dtype = bool_ if isinstance(fill_value, bool) else (
            int32 if isinstance(fill_value, int) else float32)
    return _kiln.full(_shape(shape), float(fill_value), _to_dtype(dtype),
                      _device(device) or Device("cpu"))


def arange(start: int, stop: int | None = None, step: int = 1, dtype: Any = int32,
           device: Any = None) -> Array:
    """Integers from start (0 when only one bound is given) to stop,
    exclusive; int32 unless dtype says otherwise."""
    if stop is None:
        start, stop = 0, start
    return _kiln.arange(int(start), int(stop), int(step), _to_dtype(dtype),
                        _device(device) or Device("cpu"))


def zeros_like(a: Array, dtype: Any = None) -> Array:
    """Zeros of a's shape, dtype (unless given) and device."""
    return zeros(a.shape, a.dtype if dtype is None else dtype, a.device)


def ones_like(a: Array, dtype: Any = None) -> Array:
    """Ones of a's shape, dtype (unless given) and device."""
    return ones(a.shape, a.dtype if dtype is None else dtype, a.device)


def full_like(a: Array, fill_value: float, dtype: Any = None) -> Array:
    """fill_value in a's shape, dtype (unless given) and device."""
    return full(a.shape, fill_value, a.dtype if dtype is None else dtype, a.device)


# ---- interop -------------------------------------------------------------------

def _array_protocol(self: Array, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    a = self
    if a.device.type == "cuda":
        if copy is False:
            raise ValueError("a kiln array on a GPU cannot be viewed by numpy without a copy")
        a = a.to(Device("cpu"))
    v = a._host_view()
    if a.dtype == bfloat16:
        v = v.view(_np_bfloat16)
    elif a.dtype == float16:
        v = v.view(np.float16)
    if copy:
        v = v.copy()
    if dtype is not None:
        v = v.astype(dtype, copy=False)
    return v


def _dlpack(self: Array, *, stream: Any = None, max_version: Any = None,
            dl_device: Any = None, copy: bool | None = None) -> Any:
    a = self
    if dl_device is not None and tuple(int(v) for v in dl_device) != _dlpack_device(self):
        # The array API's request for another device: the host only, by a copy.
        if int(dl_device[0]) != _DLPACK_CPU:
            raise BufferError(f"kiln cannot export an array on {self.device} to DLPack device "
                              f"{tuple(dl_device)} (the host, (1, 0), by a copy)")
        if copy is False:
            raise BufferError(f"an array on {self.device} reaches the host only by a copy "
                              "(copy=False)")
        a, dl_device = self.to(Device("cpu")), None
    elif copy:
        a = _kiln._copy(self)  # a copy of its own, on the array's device
    a.eval()  # what it is pending on runs, then
    if a.device.type == "cuda":
        _kiln.synchronize(a.device)  # has finished before the consumer reads on its stream
    kwargs = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device))
              if v is not None}
    return a._dlpack_view().__dlpack__(**kwargs)


def _dlpack_device(self: Array) -> tuple[int, int]:
    return (2, self.device.index) if self.device.type == "cuda" else (1, 0)


# ---- indexing -------------------------------------------------------------------

def _getitem(a: Array, key: Any) -> Array:
    if not isinstance(key, tuple):
        key = (key,)
    if builtins.sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > a.ndim:
        raise IndexError(f"too many indices for an array of {a.ndim} dimensions: {used}")
    items: list = []
    for k in key:
        if k is Ellipsis:
            items.extend([slice(None)] * (a.ndim - used))
        else:
            items.append(k)
    items.extend([slice(None)] * (a.ndim - builtins.sum(1 for k in items if k is not None)))
    start, stop, step, out_shape = [], [], [], []
    advanced = None  # (output axis, index array)
    axis = 0
    for k in items:
        if k is None:
            out_shape.append(1)
            continue
        n = a.shape[axis]
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            i = int(k)
            if i < -n or i >= n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            i %= n
            start.append(i), stop.append(i + 1), step.append(1)
        elif isinstance(k, slice):
            b, e, s = k.indices(n)
            if s <= 0:
                raise IndexError("kiln slices take positive steps only")
            start.append(b), stop.append(max(b, e)), step.append(s)
            out_shape.append(max(0, (max(b, e) - b + s - 1) // s))
        else:
            if advanced is not None:
                raise IndexError("kiln indexes with one integer array at most")
            idx = k if isinstance(k, Array) else asarray(np.asarray(k))
            if idx.dtype not in (int32, int64):
                raise IndexError(f"array indices must be integers, got {idx.dtype.name}")
            advanced = (len(out_shape), idx)
            start.append(0), stop.append(n), step.append(1)
            out_shape.append(n)
        axis += 1
    out = a
    if any(b != 0 or e != n or s != 1 for b, e, s, n in zip(start, stop, step, a.shape)):
        out = _kiln.slice(out, start, stop, step)
    if builtins.list(out.shape) != out_shape:
        out = _kiln.reshape(out, out_shape)
    if advanced is not None:
        out = _kiln.take(out, advanced[1], advanced[0])
    return out


# ---- methods ---------------------------------------------------------------------

def _reshape(self: Array, *shape: Any) -> Array:
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        shape = tuple(shape[0])
    return _kiln.reshape(self, [int(s) for s in shape])


def _transpose(self: Array, *axes: Any) -> Array:
    if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
        axes = tuple(axes[0])
    if not axes:
        axes = tuple(range(self.ndim))[::-1]
    return _kiln.transpose(self, [int(x) for x in axes])


def _argmax(self: Array, axis: int | None = None, keepdims: bool = False) -> Array:
    if axis is None:
        return _kiln.argmax(_kiln.reshape(self, [-1]), 0, False)
    return _kiln.argmax(self, axis, keepdims)


def _repr(self: Array) -> str:
    try:
        body = np.array2string(np.asarray(self), separator=", ", prefix="Array(")
    except KilnError as e:  # a traced or donated array has no value to show
        return f"Array(<no value: {e}>, shape={self.shape}, dtype={self.dtype.name})"
    dev = "" if self.device.type == "cpu" else f", device='{self.device}'"
    return f"Array({body}, dtype={self.dtype.name}{dev})"


def _iter(self: Array):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d array")
    for i in range(self.shape[0]):
        yield self[i]


def _index(self: Array) -> int:
    if self.dtype not in (int32, int64) or self.size != 1:
        raise TypeError("only one-element integer arrays can be used as a Python index")
    return operator.index(self.item())


def _astype(self: Array, d: Any) -> Array:
    return _kiln.astype(self, dtype(d))


def _to(self: Array, device: Any) -> Array:
    return self._to_device(_device(device))


def _bool(self: Array) -> bool:
    return bool(self.item())


def _float(self: Array) -> float:
    return float(self.item())


def _int(self: Array) -> int:
    return int(self.item())


def _sum(self: Array, axis: Any = None, keepdims: bool = False) -> Array:
    return _kiln.sum(self, axis, keepdims)


def _mean(self: Array, axis: Any = None, keepdims: bool = False) -> Array:
    return _kiln.mean(self, axis, keepdims)


def _max(self: Array, axis: Any = None, keepdims: bool = False) -> Array:
    return _kiln.max(self, axis, keepdims)


def _flatten(self: Array) -> Array:
    return _kiln.reshape(self, [-1])


def _tolist(self: Array) -> Any:
    return np.asarray(self).tolist()


def _numpy(self: Array) -> np.ndarray:
    """A writable numpy copy."""
    return np.array(self)


__all__: Sequence[str] = [
    "Array", "Device", "DType", "KilnError", "float32", "float64", "bfloat16", "float16",
    "int32", "int64", "bool_", "dtype", "devices", "asarray", "array", "from_dlpack", "zeros",
    "ones", "full", "arange", "zeros_like", "ones_like", "full_like",
]
