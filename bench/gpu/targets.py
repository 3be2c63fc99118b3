#!/usr/bin/env python3
"""Issue #16's targets, read off one bench/gpu/check.sh folder: kiln jit's
step against the fastest peer in tf32 (at most 0.7x), kiln jit's bf16 model
FLOP utilization against the measured bf16 matmul rate (at least 50%), time
to first step with a warm kernel cache (under 2 s; the cold one reported),
peak device memory against the peers', and jit against eager (at least
1.25x). Prints a markdown table; a target whose measurement is missing says
why ("failed (...)": the run's exit status or the comparison's reason).

    python3 bench/gpu/targets.py FOLDER [BF16_PEAK_GFLOPS]

FOLDER holds bench/compare.py's reports (*-tf32.json, *-bf16.json) and
check.sh's kiln runs (kiln-NAME.jsonl, with kiln-NAME.status saying how the
run ended). Without a bf16 rate (a rehearsal on the cpu) the run's own
measured peak stands in, and the row says so.
"""
import glob
import json
import os
import sys


def comparison(folder, precision):
    """(rows by name, failures by name, why the whole report is missing or None)."""
    files = sorted(glob.glob(os.path.join(folder, f"*-{precision}.json")))
    if not files:
        return {}, {}, f"no {precision} comparison (bench/compare.py did not run or wrote no report)"
    try:
        with open(files[-1]) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        return {}, {}, f"{os.path.basename(files[-1])} unreadable: {e}"
    rows = {r["name"]: r for r in report.get("rows", [])}
    failed = {r["name"]: r.get("reason", "?") for r in report.get("failed", [])}
    return rows, failed, None


def kiln_run(folder, name):
    """(the summary line of kiln-NAME.jsonl or None, why it is missing)."""
    status = ""
    try:
        with open(os.path.join(folder, f"kiln-{name}.status")) as f:
            status = f.read().strip()
    except OSError:
        pass
    try:
        with open(os.path.join(folder, f"kiln-{name}.jsonl")) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        lines = []
    s = next((l for l in reversed(lines) if l.get("summary")), None)
    if s:
        return s, None
    return None, f"kiln {name}: {status or 'not run'}"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    try:
        bf16_peak = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    except ValueError:
        bf16_peak = None
    tf32, tf32_failed, tf32_missing = comparison(folder, "tf32")
    peers = [r for r in tf32.values() if r.get("peer_row")]
    out = ["| target | measured | met |", "|---|---|---|"]

    def add(target, measured, met):
        verdict = "yes" if met else "no" if met is not None else "not measured"
        out.append(f"| {target} | {measured} | {verdict} |")

    def why_missing(*names):
        """Why the tf32 comparison lacks these rows: each one's failure, or the report's."""
        if tf32_missing:
            return f"failed ({tf32_missing})"
        reasons = [f"{n}: {tf32_failed.get(n, 'not in the report')}" for n in names if n not in tf32]
        return f"failed ({'; '.join(reasons)})" if reasons else "failed (no row)"

    def guarded(target, fn):
        try:
            fn(target)
        except Exception as e:  # noqa: BLE001 (one unreadable number must not hide the others)
            add(target, f"failed (reading it: {type(e).__name__}: {e})", None)

    def no_peer():
        if tf32_missing:
            return f"failed ({tf32_missing})"
        return "failed (no peer measured: " + "; ".join(
            f"{n}: {r}" for n, r in tf32_failed.items() if not n.startswith("kiln")) + ")"

    def jit_vs_peers(target):
        jit = tf32.get("kiln jit")
        if not jit:
            add(target, why_missing("kiln jit"), None)
        elif not peers:
            add(target, no_peer(), None)
        else:
            fastest = min(peers, key=lambda r: r["median"])
            ratio = jit["median"] / fastest["median"]
            add(target, f"{jit['median'] * 1e3:.1f} ms vs {fastest['name']} {fastest['median'] * 1e3:.1f} ms: "
                f"{ratio:.2f}×", ratio <= 0.7)

    def bf16_mfu(target):
        s, why = kiln_run(folder, "jit-bf16")
        if not s:
            add(target, f"failed ({why})", None)
            return
        peak, source = bf16_peak, "the measured bf16 matmul rate"
        if not peak:
            peak, source = s.get("peak_gflops"), "no bf16 matmul rate measured: the run's own FMA-loop peak"
        if not peak or not s.get("flops_per_step"):
            add(target, "failed (no peak rate or no FLOP count)", None)
            return
        rate = s["flops_per_step"] / s["median"] / 1e9
        mfu = rate / peak
        add(target, f"{mfu * 100:.1f}% ({rate / 1e3:.3g} of {peak / 1e3:.3g} TFLOP/s; {source})", mfu >= 0.5)

    def first_step(target):
        warm, why = kiln_run(folder, "jit-tf32-warm")
        cold, why_cold = kiln_run(folder, "jit-tf32-cold")
        cold_text = f"cold {cold['first_step_seconds']:.2f} s" if cold else f"cold failed ({why_cold})"
        if warm:
            add(target, f"warm {warm['first_step_seconds']:.2f} s, {cold_text}", warm["first_step_seconds"] < 2)
        else:
            add(target, f"failed ({why}); {cold_text}", None)

    def memory(target):
        jit = tf32.get("kiln jit")

        def mib(r):
            return r.get("peak_device_mib") or r.get("peak_rss_mib")

        mem = [(r["name"], mib(r)) for r in peers if mib(r)]
        if not jit or not mib(jit):
            add(target, why_missing("kiln jit"), None)
        elif not mem:
            add(target, no_peer(), None)
        else:
            add(target, f"kiln jit {mib(jit):.0f} MiB, " + ", ".join(f"{n} {m:.0f}" for n, m in mem) + " MiB",
                mib(jit) <= min(m for _, m in mem))

    def jit_vs_eager(target):
        jit, eager = tf32.get("kiln jit"), tf32.get("kiln eager")
        if jit and eager:
            speedup = eager["median"] / jit["median"]
            add(target, f"{speedup:.2f}× ({eager['median'] * 1e3:.1f} → {jit['median'] * 1e3:.1f} ms)",
                speedup >= 1.25)
        else:
            add(target, why_missing("kiln jit", "kiln eager"), None)

    guarded("kiln jit step ≤ 0.7× the fastest peer's (tf32)", jit_vs_peers)
    guarded("kiln jit bf16 MFU ≥ 50% of the measured bf16 matmul rate", bf16_mfu)
    guarded("time to first step < 2 s, kernel cache warm (cold reported)", first_step)
    guarded("peak device memory ≤ the peers' (tf32)", memory)
    guarded("kiln jit ≥ 1.25× kiln eager (tf32)", jit_vs_eager)
    print("\n".join(out))


if __name__ == "__main__":
    main()
