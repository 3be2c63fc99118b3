"""DLPack with PyTorch, both ways: torch reads kiln's memory without a copy,
kiln copies torch tensors in their own dtype (strided views included).
PyTorch is not in the suite's environment (a 5 GB wheel): scripts/test-torch.sh
runs this file in one of its own (KILN_TEST_TORCH=1: torch must import), and
elsewhere it is skipped. test_dlpack.py checks the same with numpy."""
import gc
import os

import numpy as np
import pytest

import kiln

if os.environ.get("KILN_TEST_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: scripts/test-torch.sh")

# kiln dtype, torch dtype
DTYPES = [(kiln.float32, torch.float32), (kiln.float64, torch.float64),
          (kiln.bfloat16, torch.bfloat16), (kiln.float16, torch.float16),
          (kiln.int32, torch.int32), (kiln.int64, torch.int64), (kiln.bool_, torch.bool)]


def _f64(a):
    return np.asarray(a).astype(np.float64)


def _address(a):
    return np.asarray(a).__array_interface__["data"][0]


@pytest.mark.parametrize("kdt,tdt", DTYPES, ids=[str(t) for _, t in DTYPES])
def test_torch_reads_a_kiln_array_without_a_copy(kdt, tdt, kiln_values):
    a = kiln_values(kdt)
    t = torch.from_dlpack(a)
    assert t.dtype == tdt and tuple(t.shape) == (3, 4) and t.device.type == "cpu"
    assert t.data_ptr() == _address(a)
    np.testing.assert_array_equal(t.to(torch.float64).numpy(), _f64(a))


def test_a_torch_view_outlives_its_kiln_array():
    a = kiln.arange(1000, dtype=kiln.float32) + 1.0
    t = torch.from_dlpack(a)
    del a
    gc.collect()
    for _ in range(20):  # allocations that would reuse the memory if it were freed
        kiln.zeros((1000,)) + 5.0
    assert torch.equal(t, torch.arange(1000, dtype=torch.float32) + 1)


def test_a_pending_lazy_array_runs_before_torch_reads_it():
    with kiln.lazy():
        a = kiln.ones((3,)) * 4.0
        assert torch.equal(torch.from_dlpack(a), torch.full((3,), 4.0))


def test_jit_refuses_to_donate_memory_that_torch_views():
    f = kiln.jit(lambda x: x * 2.0, donate_argnums=0)
    a = kiln.ones((4,)) + 1.0
    t = torch.from_dlpack(a)
    with pytest.raises(kiln.KilnError, match="donated"):
        f(a)
    assert torch.equal(t, torch.full((4,), 2.0))
    del t
    gc.collect()
    np.testing.assert_array_equal(np.asarray(f(a)), [4, 4, 4, 4])


@pytest.mark.parametrize("kdt,tdt", DTYPES, ids=[str(t) for _, t in DTYPES])
def test_kiln_copies_a_torch_tensor_in_its_dtype(kdt, tdt):
    t = (torch.arange(12, dtype=torch.float64).reshape(3, 4) * 0.75 - 4.0).to(tdt)
    for a in (kiln.from_dlpack(t), kiln.asarray(t)):
        assert a.dtype == kdt and a.shape == (3, 4)
        np.testing.assert_array_equal(_f64(a), t.to(torch.float64).numpy())
    a = kiln.from_dlpack(t)
    t.zero_()  # a copy: kiln's array does not change with the tensor
    assert _f64(a).any()
    if tdt == torch.bfloat16:  # bit for bit, back and forth
        back = torch.from_dlpack(kiln.from_dlpack(t.view(torch.int16).random_().view(tdt)))
        assert torch.equal(back.view(torch.int16), t.view(torch.int16))


def test_kiln_copies_strided_torch_views():
    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    views = [base.permute(3, 1, 0, 2), base[:, 1:, ::2, 1::3], base.transpose(0, 3)[1],
             base[1, 2, :, 3], torch.arange(6.0).reshape(2, 3).T,
             torch.arange(3.0).expand(4, 3),  # a zero stride
             base[0, 0, 0, 0], base[:, :, :0]]
    for v in views:
        assert not v.is_contiguous() or v.dim() == 0 or v.numel() == 0
        a = kiln.from_dlpack(v)
        assert a.shape == tuple(v.shape)
        np.testing.assert_array_equal(np.asarray(a), v.contiguous().numpy(), err_msg=str(v.stride()))
    bf = base.to(torch.bfloat16).permute(2, 0, 3, 1)
    np.testing.assert_array_equal(_f64(kiln.from_dlpack(bf)), bf.double().contiguous().numpy())


def test_torch_tensors_are_operands_of_kiln_ops():
    a = kiln.asarray(np.float32([[1, 2], [3, 4]]))
    t = torch.tensor([[10.0, 20.0], [30.0, 40.0]])
    np.testing.assert_array_equal(np.asarray(a + t), [[11, 22], [33, 44]])
    np.testing.assert_array_equal(np.asarray(a @ t.T), np.float32([[50, 110], [110, 250]]))


def test_unsupported_torch_dtypes_are_named():
    with pytest.raises(kiln.KilnError, match=r"uint8.*kiln holds float32"):
        kiln.from_dlpack(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(kiln.KilnError, match="complex64"):
        kiln.from_dlpack(torch.zeros(3, dtype=torch.complex64))


_KILN_GPUS = sum(d.type == "cuda" for d in kiln.devices())


class _CudaProducer:
    """A DLPack producer on CUDA device 0 (another library's GPU array) that
    records the stream its consumer asks it to order its writes before."""

    def __init__(self):
        self.streams = []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kwargs):
        self.streams.append(stream)
        raise BufferError("a stand-in: no device memory behind it")


@pytest.mark.skipif(_KILN_GPUS > 0, reason="a CUDA GPU is visible")
def test_a_device_array_without_a_gpu_is_a_clear_error():
    x = _CudaProducer()
    with pytest.raises(kiln.KilnError, match="cuda"):
        kiln.from_dlpack(x)
    assert x.streams == []  # refused before the producer was asked for its memory


@pytest.mark.skipif(not torch.cuda.is_available() or _KILN_GPUS == 0,
                    reason="needs a CUDA GPU for both PyTorch and kiln")
def test_cuda_tensors_both_ways():
    t = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6) * 0.5
    a = kiln.from_dlpack(t)  # a copy on the GPU, ordered after torch's writes
    assert a.device == kiln.Device("cuda:0") and a.shape == (4, 6)
    t.add_(1.0)  # the copy does not change with the tensor
    np.testing.assert_array_equal(np.asarray(a.to(kiln.Device("cpu"))),
                                  (t - 1.0).cpu().numpy())
    back = torch.from_dlpack(a * 2.0)  # torch reads kiln's device memory in place
    assert back.is_cuda and torch.equal(back, (t - 1.0) * 2.0)
    x = _CudaProducer()
    with pytest.raises(BufferError):
        kiln.from_dlpack(x)
    assert x.streams == [kiln._kiln._stream(kiln.Device("cuda:0"))] and x.streams[0] > 2
    with pytest.raises(kiln.KilnError, match="contiguous"):
        kiln.from_dlpack(t.T)
