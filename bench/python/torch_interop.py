#!/usr/bin/env python3
"""DLPack between kiln and PyTorch, both ways, in an interpreter that has
both (the test suite's .venv has no PyTorch: its wheel is gigabytes). Run
where kiln was installed with `pip install .` beside torch, e.g.

    bench/peers/.venv-gpu-machine/bin/pip install . -C cmake.define.KILN_CUDA=OFF
    bench/peers/.venv-gpu-machine/bin/python bench/python/torch_interop.py

Exits non-zero when a check fails; prints one line per check.
"""
import gc
import sys

import ml_dtypes
import numpy as np
import torch

import kiln

failures = 0


def check(name, ok):
    global failures
    print(("ok    " if ok else "FAIL  ") + name)
    failures += not ok


a = kiln.asarray(np.arange(12, dtype=np.float32).reshape(3, 4)) * 2.0
t = torch.from_dlpack(a)
check("torch.from_dlpack(kiln array) shares memory",
      t.data_ptr() == np.asarray(a).__array_interface__["data"][0])
check("values, shape and dtype", t.shape == (3, 4) and t.dtype == torch.float32
      and torch.equal(t, torch.arange(12, dtype=torch.float32).reshape(3, 4) * 2))
for nd, td in ((ml_dtypes.bfloat16, torch.bfloat16), (np.float16, torch.float16),
               (np.int64, torch.int64), (np.int32, torch.int32), (np.bool_, torch.bool),
               (np.float64, torch.float64)):
    x = kiln.asarray(np.array([1, 0, 3], dtype=nd))
    y = torch.from_dlpack(x)
    check(f"{x.dtype.name} -> {td}", y.dtype == td and y.tolist() == np.asarray(x).tolist())
view = torch.from_dlpack(kiln.asarray(np.full(1000, 7, np.float32)) + 1.0)
gc.collect()
for _ in range(10):
    kiln.zeros((1000,)) + 3.0
check("a torch view outlives its kiln array", bool((view == 8).all()))
src = torch.arange(6, dtype=torch.int64).reshape(2, 3)
k = kiln.from_dlpack(src)
check("kiln.from_dlpack(torch tensor): a copy with its dtype",
      k.dtype == kiln.int64 and np.asarray(k).tolist() == src.tolist())
b = kiln.from_dlpack(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
check("kiln.from_dlpack(torch bf16)", b.dtype == kiln.bfloat16
      and np.asarray(b).astype(np.float32).tolist() == [1.5, -2.0])
g = kiln.grad(lambda w: kiln.sum(kiln.asarray(torch.ones(3).numpy()) * w * w))(
    kiln.from_dlpack(torch.tensor([1.0, 2.0, 3.0])))
check("gradients of torch-made inputs", np.asarray(g).tolist() == [2.0, 4.0, 6.0])
print(f"torch {torch.__version__}, kiln {kiln.__version__}: "
      f"{'all passed' if not failures else f'{failures} failed'}")
sys.exit(1 if failures else 0)
