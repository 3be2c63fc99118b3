#!/usr/bin/env python3
"""Turns a kiln-bench-ops JSON file (Google Benchmark, with repetitions) into
the Markdown tables of bench/results: medians, spread, kiln's ratio to the
faster direct oneDNN path.

    python3 bench/summarize_ops.py RESULT.json > bench/results/DATE-ops-cpu.md
"""
import json

from benchutil import cpu_model
import platform
import subprocess
import sys


def main(path):
    data = json.load(open(path))
    ctx = data["context"]
    med, cv = {}, {}
    for b in data["benchmarks"]:
        name = b["run_name"].replace("/real_time", "")
        if b.get("aggregate_name") == "median":
            med[name] = b
        elif b.get("aggregate_name") == "cv":
            cv[name] = b
    print(f"# kiln op benchmarks, CPU\n")
    print(f"- date: {ctx['date']}")
    print(f"- machine: {cpu_model()}, {ctx['num_cpus']} CPUs, host {ctx['host_name']}")
    print(f"- threads: OpenMP default (all {ctx['num_cpus']} CPUs)")
    print(f"- command: `{ctx['executable']} --benchmark_repetitions=5 "
          "--benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true`")
    reps = next(iter(med.values()))["repetitions"]
    print(f"- figures: median of {reps} repetitions (interleaved at random); ± is the coefficient"
          " of variation across repetitions\n")

    gemms = []
    for name in med:
        if name.startswith("matmul_f32/") and name.endswith("/kiln"):
            gemms.append(name.split("/")[1])

    def g(key):
        return med[key]["GFLOP/s"]

    def spread(key):
        return 100 * cv[key]["real_time"] if key in cv else float("nan")

    print("## matmul f32 at the ViT-B/16 training shapes, GFLOP/s\n")
    print("| GEMM | kiln | dnnl_sgemm | dnnl matmul primitive | kiln / faster |")
    print("|---|---|---|---|---|")
    worst = 9.0
    for n in gemms:
        k, s, p = (f"matmul_f32/{n}/{x}" for x in ("kiln", "dnnl_sgemm", "dnnl_matmul"))
        r = g(k) / max(g(s), g(p))
        worst = min(worst, r)
        print(f"| {n} | {g(k):.0f} ±{spread(k):.0f}% | {g(s):.0f} ±{spread(s):.0f}% | "
              f"{g(p):.0f} ±{spread(p):.0f}% | {r:.3f} |")
    print(f"\nLowest ratio: {worst:.3f}.\n")
    print("## matmul bf16 inputs, f32 output, GFLOP/s\n")
    print("| GEMM | kiln | dnnl matmul primitive | kiln / primitive |")
    print("|---|---|---|---|")
    worst = 9.0
    for n in gemms:
        k, p = f"matmul_bf16/{n}/kiln", f"matmul_bf16/{n}/dnnl_matmul"
        r = g(k) / g(p)
        worst = min(worst, r)
        print(f"| {n} | {g(k):.0f} ±{spread(k):.0f}% | {g(p):.0f} ±{spread(p):.0f}% | {r:.3f} |")
    print(f"\nLowest ratio: {worst:.3f}.\n")
    print("## elementwise, softmax, LayerNorm (f32, bytes read + written)\n")
    print("| benchmark | time | GB/s |")
    print("|---|---|---|")
    for name, b in med.items():
        if name.startswith("BM_") and "bytes_per_second" in b:
            print(f"| {name[3:]} | {b['real_time']:.0f} {b['time_unit']} ±{spread(name):.0f}% | "
                  f"{b['bytes_per_second'] / 1e9:.1f} |")
    print("\n## dispatch: one eager op on a 1-element f32 array\n")
    print("| op | time per op |")
    print("|---|---|")
    for name, b in med.items():
        if name.startswith("BM_dispatch"):
            print(f"| {name[len('BM_dispatch_'):]} | {b['real_time']:.0f} {b['time_unit']} |")


if __name__ == "__main__":
    main(sys.argv[1])
