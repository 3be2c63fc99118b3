#!/usr/bin/env python3
"""PyTorch's bf16 matmul (bf16 result) on the ViT-S/16 training GEMMs at batch
32, the shapes of bench/ops_bench.cpp's matmul_bf16_vit_small: the peer of
bench/bf16_gemm.sh. Prints one JSON object per shape: the median of REPS
timed runs after two untimed ones, in GFLOP/s."""
import argparse
import json
import statistics
import time

import torch

M = 32 * 197
SHAPES = [  # name, m, k, n, ta, tb (C[m,n] = op(A)[m,k] op(B)[k,n])
    ("qkv_fwd", M, 384, 1152, False, True), ("qkv_dx", M, 1152, 384, False, False),
    ("qkv_dw", 1152, M, 384, True, False), ("proj_fwd", M, 384, 384, False, True),
    ("proj_dx", M, 384, 384, False, False), ("proj_dw", 384, M, 384, True, False),
    ("fc1_fwd", M, 384, 1536, False, True), ("fc1_dx", M, 1536, 384, False, False),
    ("fc1_dw", 1536, M, 384, True, False), ("fc2_fwd", M, 1536, 384, False, True),
    ("fc2_dx", M, 384, 1536, False, False), ("fc2_dw", 384, M, 1536, True, False),
]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for name, m, k, n, ta, tb in SHAPES:
        a = torch.randn((k, m) if ta else (m, k)).bfloat16()
        b = torch.randn((n, k) if tb else (k, n)).bfloat16()
        A, B = (a.t() if ta else a), (b.t() if tb else b)
        times = []
        for r in range(args.reps + 2):
            t0 = time.perf_counter()
            c = A @ B  # the CPU computes it before returning
            dt = time.perf_counter() - t0
            if r >= 2:
                times.append(dt)
        assert c.dtype == torch.bfloat16
        med = statistics.median(times)
        print(json.dumps({"name": name, "gflops": 2.0 * m * n * k / med / 1e9,
                          "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                          "max_ms": max(times) * 1e3, "torch": torch.__version__,
                          "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
