#!/usr/bin/env python3
"""Prints the GPU's measured matmul rate in GFLOP/s: the median of ten
8192x8192x8192 products, timed with CUDA events after three warm-ups; f32
with tf32 allowed (the reference experiment's setting, the default) or bf16
(--dtype bf16: the rate bf16 model FLOP utilization is measured against).
bench/gpu_peers.sh passes it to bench/compare as the peak for MFU."""
import argparse
import statistics
import sys

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtype", default="tf32", choices=["tf32", "bf16"])
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_peak: no CUDA device is visible")
    torch.backends.cuda.matmul.allow_tf32 = True
    n = 8192
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    a = torch.randn(n, n, device="cuda", dtype=dt)
    b = torch.randn(n, n, device="cuda", dtype=dt)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    t = statistics.median(times)
    print(f"{2 * n**3 / t / 1e9:.0f}")
    print(f"gpu_peak: {torch.cuda.get_device_name()}, {args.dtype} {n}^3 matmul: median {t * 1e3:.2f} ms "
          f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}) over 10", file=sys.stderr)


if __name__ == "__main__":
    main()
