"""kiln.Array: creation, dtypes, numpy and DLPack interop, indexing, methods."""
import gc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import kiln


def test_numpy_input_keeps_its_dtype():
    for dt in (np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_):
        x = np.arange(6).reshape(2, 3).astype(dt)
        a = kiln.asarray(x)
        assert a.dtype == kiln.dtype(dt)
        assert a.shape == (2, 3) and a.ndim == 2 and a.size == 6
        np.testing.assert_array_equal(np.asarray(a), x)
        assert np.asarray(a).dtype == x.dtype


def test_bfloat16_round_trips_through_ml_dtypes():
    x = np.array([1.5, -2.25, 3e-3], dtype=ml_dtypes.bfloat16)
    a = kiln.asarray(x)
    assert a.dtype == kiln.bfloat16
    back = np.asarray(a)
    assert back.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back.view(np.uint16), x.view(np.uint16))
    np.testing.assert_array_equal(np.asarray(kiln.asarray(np.float32([1.5, 3e-3])).astype("bf16")),
                                  np.float32([1.5, 3e-3]).astype(ml_dtypes.bfloat16))


def test_python_values_as_jax_takes_them():
    assert kiln.asarray(1.5).dtype == kiln.float32
    assert kiln.asarray([1, 2]).dtype == kiln.int32
    assert kiln.asarray([[True, False]]).dtype == kiln.bool_
    assert kiln.asarray([1.0, 2.0], dtype="float64").dtype == kiln.float64
    assert kiln.asarray(3).item() == 3 and isinstance(kiln.asarray(3).item(), int)
    assert kiln.asarray(2.5).item() == 2.5
    assert kiln.asarray(True).item() is True


def test_python_values_with_a_dtype_are_exact():
    assert np.asarray(kiln.asarray([0.1], dtype="float64"))[0] == 0.1
    assert kiln.asarray(3_000_000_000, dtype="int64").item() == 3_000_000_000
    with pytest.raises(kiln.KilnError, match="int32's range"):
        kiln.asarray(3_000_000_000)


def test_other_objects_compare_as_python_does():
    a = kiln.ones((2,))
    assert (a == None) is False and (a != "x") is True  # noqa: E711
    with pytest.raises(TypeError):
        a + "x"


def test_unsupported_numpy_dtype_is_a_clear_error():
    with pytest.raises(kiln.KilnError, match="uint8"):
        kiln.asarray(np.zeros(3, np.uint8))
    with pytest.raises(kiln.KilnError, match="uint8"):
        kiln.from_dlpack(np.zeros(3, np.uint8))
    with pytest.raises(kiln.KilnError, match="not a kiln dtype"):
        kiln.zeros((2,), dtype="complex64")


def test_creation():
    np.testing.assert_array_equal(np.asarray(kiln.zeros((2, 3))), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(kiln.ones(4, kiln.int32)), np.ones(4, np.int32))
    np.testing.assert_array_equal(np.asarray(kiln.full((2,), 7.5)), np.full(2, 7.5, np.float32))
    assert kiln.full((2,), 3).dtype == kiln.int32
    np.testing.assert_array_equal(np.asarray(kiln.arange(5)), np.arange(5, dtype=np.int32))
    np.testing.assert_array_equal(np.asarray(kiln.arange(2, 9, 3, dtype=kiln.float32)),
                                  np.arange(2, 9, 3, dtype=np.float32))
    a = kiln.asarray(np.ones((2, 2), np.float64))
    assert kiln.zeros_like(a).dtype == kiln.float64 and kiln.ones_like(a).shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(kiln.full_like(a, 2.0)), np.full((2, 2), 2.0))
    c = kiln.array(a)  # a copy
    assert not np.shares_memory(np.asarray(c), np.asarray(a))


def test_numpy_view_is_zero_copy_and_read_only():
    a = kiln.asarray(np.arange(12, dtype=np.float32).reshape(3, 4)) * 2.0
    v1, v2 = np.asarray(a), np.asarray(a)
    assert np.shares_memory(v1, v2)
    assert not v1.flags.writeable
    with pytest.raises(ValueError):
        v1[0, 0] = 1
    copy = np.array(a)
    assert copy.flags.writeable and not np.shares_memory(copy, v1)


def test_a_view_outlives_its_array():
    a = kiln.asarray(np.arange(1000, dtype=np.float32)) + 1.0
    v = np.asarray(a)
    del a
    gc.collect()
    for _ in range(20):  # allocations that would reuse the memory if it were freed
        kiln.zeros((1000,)) + 5.0
    np.testing.assert_array_equal(v, np.arange(1000, dtype=np.float32) + 1)


def test_dlpack_both_ways_with_numpy():
    a = kiln.asarray(np.arange(6, dtype=np.float32).reshape(2, 3)) + 0.5
    assert a.__dlpack_device__() == (1, 0)
    n = np.from_dlpack(a)
    assert np.shares_memory(n, np.asarray(a))
    np.testing.assert_array_equal(n, np.asarray(a))
    c = np.from_dlpack(a, copy=True)  # a copy of its own
    np.testing.assert_array_equal(c, np.asarray(a))
    assert not np.shares_memory(c, np.asarray(a))
    h = np.from_dlpack(a, device="cpu")  # the array API's dl_device=(1, 0): its own device
    assert np.shares_memory(h, np.asarray(a))
    for copy in (True, None):  # a view of a slice is copied from its offset
        np.testing.assert_array_equal(np.from_dlpack(a[1:], copy=copy), [[3.5, 4.5, 5.5]])
    with pytest.raises(BufferError, match=r"DLPack device \(2, 0\)"):
        a.__dlpack__(dl_device=(2, 0))
    with kiln.lazy():
        pending = kiln.ones((3,)) * 4.0
        np.testing.assert_array_equal(np.from_dlpack(pending), [4, 4, 4])  # run first
    b = kiln.from_dlpack(np.arange(4, dtype=np.int64))
    assert b.dtype == kiln.int64
    np.testing.assert_array_equal(np.asarray(b), np.arange(4))


def test_indexing_like_numpy(rng):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    a = kiln.asarray(x)
    for key in [1, -1, (slice(1, 3),), (slice(None), 2), (Ellipsis, 3), (0, slice(None, None, 2)),
                (slice(1, None), None, slice(0, 4, 3)), (None, Ellipsis), (2, 3, 4),
                (slice(10, 20),), ([0, 2, 3],), (slice(None), np.array([4, 0]))]:
        np.testing.assert_array_equal(np.asarray(a[key]), x[key], err_msg=str(key))
    with pytest.raises(IndexError):
        a[4]
    with pytest.raises(IndexError):
        a[0, 0, 0, 0]
    with pytest.raises(IndexError, match="positive steps"):
        a[::-1]


def test_methods(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    a = kiln.asarray(x)
    np.testing.assert_array_equal(np.asarray(a.T), x.T)
    np.testing.assert_array_equal(np.asarray(a.reshape(6, 4)), x.reshape(6, 4))
    np.testing.assert_array_equal(np.asarray(a.reshape((4, -1))), x.reshape(4, -1))
    np.testing.assert_array_equal(np.asarray(a.transpose(1, 0, 2)), x.transpose(1, 0, 2))
    np.testing.assert_allclose(np.asarray(a.sum()), x.sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(a.mean(axis=1)), x.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(a.max(axis=(0, 2), keepdims=True)),
                               x.max(axis=(0, 2), keepdims=True))
    np.testing.assert_array_equal(np.asarray(a.argmax(axis=-1)), x.argmax(axis=-1))
    assert a.argmax().item() == x.argmax()
    assert a.astype(kiln.int32).dtype == kiln.int32
    assert a.tolist() == x.tolist()
    assert len(a) == 2 and [r.shape for r in a] == [(3, 4), (3, 4)]
    assert float(a[0, 0, 0]) == float(x[0, 0, 0])
    assert "dtype=float32" in repr(a)


def test_devices_and_to():
    names = [str(d) for d in kiln.devices()]
    assert names[:2] == ["cpu", "ref"]
    a = kiln.asarray(np.arange(3, dtype=np.float32))
    r = a.to("ref")
    assert r.device == kiln.Device("ref") and str(r.device) == "ref"
    np.testing.assert_array_equal(np.asarray(r * 2.0), np.arange(3) * 2.0)
    with pytest.raises(kiln.KilnError, match="device"):
        a.to("tpu")


def test_errors_become_kiln_errors():
    a = kiln.ones((2, 3))
    with pytest.raises(kiln.KilnError, match=r"\[matmul\]"):
        a @ a
    assert issubclass(kiln.KilnError, RuntimeError)
    with pytest.raises(kiln.KilnError, match="item"):
        a.item()


def test_the_package_ships_type_information():
    import ast
    import os

    here = os.path.dirname(kiln.__file__)
    assert os.path.exists(os.path.join(here, "py.typed"))
    with open(os.path.join(here, "_kiln.pyi")) as f:
        stub = ast.parse(f.read())
    names = {n.name for n in stub.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert {"Array", "DType", "ViTConfig", "zeros", "matmul", "softmax"} <= names


def test_docstrings_come_from_the_cpp_comments():
    assert "jnp.take(a, indices, axis)" in kiln.take.__doc__  # include/kiln/ops.h's comment
    assert "never stored" in kiln.attention.__doc__
    assert "axes may be negative" in kiln.sum.__doc__
    for f in (kiln.zeros, kiln.asarray, kiln.grad, kiln.jit, kiln.nn.ViTForImageClassification,
              kiln.optim.AdamW, kiln.data.Loader, kiln.train.run, kiln.random.normal):
        assert f.__doc__ and f.__doc__.strip(), f


def test_array_is_defined_once_in_the_module():
    # kiln.Array's every method is declared by the module's class
    # (python/src/arrays.cpp): none is a Python function patched on afterwards,
    # so the type stub (_kiln.pyi) lists them all.
    import inspect

    patched = [name for name, value in vars(kiln.Array).items()
               if inspect.isfunction(value) or inspect.isgeneratorfunction(value)]
    assert patched == []
    for name in ["__getitem__", "__array__", "__dlpack__", "reshape", "astype", "to", "sum",
                 "numpy", "tolist"]:
        assert type(vars(kiln.Array)[name]).__name__ == "nb_method", name
    type_stub = (Path(kiln.__file__).parent / "_kiln.pyi").read_text()
    assert "def __getitem__(self, key: Any, /) -> Array:" in type_stub
    assert "def to(self, device: Any) -> Array:" in type_stub
    a = kiln.asarray(np.arange(6, dtype=np.float32)).reshape(2, 3)
    assert a[1, ::2].tolist() == [3.0, 5.0]
    assert a.to("cpu").astype("bf16").dtype == kiln.bfloat16
