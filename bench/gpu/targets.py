#!/usr/bin/env python3
"""Issue #16's targets, read off one bench/gpu/check.sh folder: kiln jit's
step against the fastest peer in tf32 (at most 0.7x), kiln jit's bf16 model
FLOP utilization against the measured bf16 matmul rate (at least 50%), time
to first step with a warm kernel cache (under 2 s; the cold one reported),
peak device memory against the peers', and jit against eager (at least
1.25x). Prints a markdown table; a target whose measurement is missing says
so.

    python3 bench/gpu/targets.py OUT_FOLDER [BF16_PEAK_GFLOPS]
"""
import glob
import json
import os
import sys


def rows(folder, precision):
    files = sorted(glob.glob(os.path.join(folder, f"*-cuda-*-{precision}.json")))
    if not files:
        return {}
    with open(files[-1]) as f:
        return {r["name"]: r for r in json.load(f)["rows"]}


def summary(path):
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    except OSError:
        return None
    return next((l for l in reversed(lines) if l.get("summary")), None)


def main():
    folder = sys.argv[1]
    bf16_peak = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    tf32, bf16 = rows(folder, "tf32"), rows(folder, "bf16")
    peers = [r for r in tf32.values() if r.get("peer_row")]
    out = ["| target | measured | met |", "|---|---|---|"]

    def add(target, measured, met):
        out.append(f"| {target} | {measured} | {'yes' if met else ('no' if met is not None else 'not measured')} |")

    jit = tf32.get("kiln jit")
    if jit and peers:
        fastest = min(peers, key=lambda r: r["median"])
        ratio = jit["median"] / fastest["median"]
        add("kiln jit step ≤ 0.7× the fastest peer's (tf32)",
            f"{jit['median'] * 1e3:.1f} ms vs {fastest['name']} {fastest['median'] * 1e3:.1f} ms: {ratio:.2f}×",
            ratio <= 0.7)
    else:
        add("kiln jit step ≤ 0.7× the fastest peer's (tf32)", "missing", None)
    s = summary(os.path.join(folder, "kiln-jit-bf16.jsonl"))
    if s and bf16_peak and s.get("flops_per_step"):
        mfu = s["flops_per_step"] / s["median"] / 1e9 / bf16_peak
        add("kiln jit bf16 MFU ≥ 50% of the measured bf16 matmul rate",
            f"{mfu * 100:.1f}% ({s['flops_per_step'] / s['median'] / 1e12:.0f} of {bf16_peak / 1e3:.0f} TFLOP/s)",
            mfu >= 0.5)
    else:
        add("kiln jit bf16 MFU ≥ 50% of the measured bf16 matmul rate", "missing", None)
    warm = summary(os.path.join(folder, "kiln-jit-tf32-warm.jsonl"))
    cold = summary(os.path.join(folder, "kiln-jit-tf32-cold.jsonl"))
    if warm:
        add("time to first step < 2 s, kernel cache warm (cold reported)",
            f"warm {warm['first_step_seconds']:.2f} s, cold "
            f"{cold['first_step_seconds']:.2f} s" if cold else f"warm {warm['first_step_seconds']:.2f} s",
            warm["first_step_seconds"] < 2)
    else:
        add("time to first step < 2 s, kernel cache warm (cold reported)", "missing", None)
    mem = [r.get("peak_device_mib") for r in peers if r.get("peak_device_mib")]
    if jit and jit.get("peak_device_mib") and mem:
        add("peak device memory ≤ the peers' (tf32)",
            f"kiln jit {jit['peak_device_mib']:.0f} MiB, peers {', '.join(f'{m:.0f}' for m in mem)} MiB",
            jit["peak_device_mib"] <= min(mem))
    else:
        add("peak device memory ≤ the peers' (tf32)", "missing", None)
    eager = tf32.get("kiln eager")
    if jit and eager:
        speedup = eager["median"] / jit["median"]
        add("kiln jit ≥ 1.25× kiln eager (tf32)", f"{speedup:.2f}×", speedup >= 1.25)
    else:
        add("kiln jit ≥ 1.25× kiln eager (tf32)", "missing", None)
    print("\n".join(out))


if __name__ == "__main__":
    main()
