"""DLPack with numpy, both ways: numpy reads kiln's memory without a copy
(np.from_dlpack), kiln copies numpy arrays in their own dtype, strided views
included (kiln.from_dlpack); test_array.py has the basics (copies, devices,
slices, a pending lazy array). The same with PyTorch, bfloat16 included, is
test_torch_interop.py, where PyTorch is installed (scripts/test-torch.sh)."""
import gc

import numpy as np
import pytest

import kiln

# kiln dtype, numpy dtype (numpy has no bfloat16 that DLPack carries)
DTYPES = [(kiln.float32, np.float32), (kiln.float64, np.float64), (kiln.float16, np.float16),
          (kiln.int32, np.int32), (kiln.int64, np.int64), (kiln.bool_, np.bool_)]


def _address(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("kdt,ndt", DTYPES, ids=[np.dtype(n).name for _, n in DTYPES])
def test_numpy_reads_a_kiln_array_without_a_copy(kdt, ndt, kiln_values):
    a = kiln_values(kdt)
    n = np.from_dlpack(a)
    assert n.dtype == ndt and n.shape == (3, 4)
    assert _address(n) == _address(np.asarray(a))
    np.testing.assert_array_equal(n.astype(np.float64), np.asarray(a).astype(np.float64))


def test_a_numpy_view_outlives_its_kiln_array():
    a = kiln.arange(1000, dtype=kiln.float32) + 1.0
    n = np.from_dlpack(a)
    del a
    gc.collect()
    for _ in range(20):  # allocations that would reuse the memory if it were freed
        kiln.zeros((1000,)) + 5.0
    np.testing.assert_array_equal(n, np.arange(1000, dtype=np.float32) + 1)


def test_jit_refuses_to_donate_memory_that_numpy_views():
    f = kiln.jit(lambda x: x * 2.0, donate_argnums=0)
    a = kiln.ones((4,)) + 1.0
    n = np.from_dlpack(a)
    with pytest.raises(kiln.KilnError, match="donated"):
        f(a)
    np.testing.assert_array_equal(n, [2.0, 2.0, 2.0, 2.0])
    del n
    gc.collect()
    np.testing.assert_array_equal(np.asarray(f(a)), [4, 4, 4, 4])


@pytest.mark.parametrize("kdt,ndt", DTYPES, ids=[np.dtype(n).name for _, n in DTYPES])
def test_kiln_copies_a_numpy_array_in_its_dtype(kdt, ndt):
    n = (np.arange(12, dtype=np.float64).reshape(3, 4) * 0.75 - 4.0).astype(ndt)
    a = kiln.from_dlpack(n)
    assert a.dtype == kdt and a.shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(a), n)
    n[...] = 0  # a copy: kiln's array does not change with numpy's
    assert np.asarray(a).astype(np.float64).any()


def test_kiln_copies_strided_numpy_views():
    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    views = [base.transpose(3, 1, 0, 2), base[:, 1:, ::2, 1::3], base.transpose(3, 1, 2, 0)[1],
             base[1, 2, :, 3], base[::-1, :, ::-2],  # negative strides
             np.broadcast_to(np.arange(3.0), (4, 3)),  # a zero stride
             base[0, 0, 0, 0], base[:, :, :0]]
    for v in views:
        assert not v.flags.c_contiguous or v.ndim == 0 or v.size == 0
        a = kiln.from_dlpack(v)
        assert a.shape == v.shape
        np.testing.assert_array_equal(np.asarray(a), v, err_msg=str(v.strides))


def test_unsupported_numpy_dtypes_are_named():  # (uint8: test_array.py)
    with pytest.raises(kiln.KilnError, match="complex64"):
        kiln.from_dlpack(np.zeros(3, dtype=np.complex64))
