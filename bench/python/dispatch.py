#!/usr/bin/env python3
"""The per-op overhead of eager dispatch from Python: microseconds per call
of small-array ops (an add and a matmul of 4x4 f32 arrays, a sum), for each
framework this interpreter can import: kiln (PYTHONPATH=build/python),
PyTorch, JAX (eager jnp, on the CPU) and numpy as the floor. Each op's
result is materialized (kiln runs eagerly; JAX's block_until_ready). Prints
one JSON object: {framework: {op: microseconds (median of repeats)}}.

    PYTHONPATH=build/python .venv/bin/python bench/python/dispatch.py
"""
import json
import statistics
import sys
import time

import numpy as np

N, REPEATS = 20000, 7


def measure(fn):
    for _ in range(1000):  # warm up (and JAX's per-op compilation)
        fn()
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        runs.append((time.perf_counter() - t0) / N * 1e6)
    return {"median_us": statistics.median(runs), "min_us": min(runs), "max_us": max(runs)}


def ops(a, b, add, matmul, total, sync=lambda x: x):
    return {"add": measure(lambda: sync(add(a, b))), "matmul": measure(lambda: sync(matmul(a, b))),
            "sum": measure(lambda: sync(total(a)))}


def main():
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    out = {"python": sys.version.split()[0]}
    out["numpy"] = ops(x, x, np.add, np.matmul, np.sum)
    try:
        import kiln
        kiln.set_num_threads(1)
        a = kiln.asarray(x)
        out["kiln"] = ops(a, a, lambda p, q: p + q, lambda p, q: p @ q, kiln.sum)
        out["kiln"]["version"] = kiln.__version__
    except ImportError:
        pass
    try:
        import torch
        torch.set_num_threads(1)
        t = torch.from_numpy(x)
        with torch.no_grad():
            out["torch"] = ops(t, t, torch.add, torch.matmul, torch.sum)
        out["torch"]["version"] = torch.__version__
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        j = jnp.asarray(x)
        out["jax"] = ops(j, j, jnp.add, jnp.matmul, jnp.sum, lambda r: r.block_until_ready())
        out["jax"]["version"] = jax.__version__
    except ImportError:
        pass
    print(json.dumps(out))


if __name__ == "__main__":
    main()
