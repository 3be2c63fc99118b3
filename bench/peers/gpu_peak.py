#!/usr/bin/env python3
"""Prints the GPU's measured tf32 matmul rate in GFLOP/s: the median of ten
8192x8192x8192 f32 products with tf32 allowed (the reference experiment's
setting), timed with CUDA events after three warm-ups. bench/gpu_peers.sh
passes it to bench/compare as the peak that MFU is computed against."""
import statistics
import sys

import torch


def main():
    if not torch.cuda.is_available():
        sys.exit("gpu_peak: no CUDA device is visible")
    torch.backends.cuda.matmul.allow_tf32 = True
    n = 8192
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
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
    print(f"gpu_peak: {torch.cuda.get_device_name()}, tf32 {n}^3 matmul: median {t * 1e3:.2f} ms "
          f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}) over 10", file=sys.stderr)


if __name__ == "__main__":
    main()
