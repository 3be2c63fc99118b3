#!/usr/bin/env python3
"""Runs kiln's modes and the real PyTorch and JAX on the reference experiment,
one after another on this machine, and writes
bench/results/<date>-<device>-<model>.{json,md,png}.

    bench/compare --model vit-tiny --steps 12 --warmup 2 [--rounds 3]

With --rounds N every program runs N times, round k starting at the k-th
program (the order rotates), so that no program always runs first or after
the same neighbour; each row reports the median over rounds of its median
step, and the per-round medians.
"""
import argparse
import datetime
import json
import os
import statistics
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_model, gpu_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "bench", "peers")
VENV_PY = os.path.join(PEERS, ".venv", "bin", "python")


class Stopped(Exception):
    """SIGTERM (a timeout around the whole comparison): the running program is killed, the report written."""


def write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def last_line(text):
    """The last non-empty line of a program's output (its error, mostly), fit for a table cell."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return (lines[-1] if lines else "no output")[:160].replace("|", "/")


def run(name, cmd, log, reuse=False, timeout=None):
    """Runs one program; returns (its summary, None) or (None, why it has none)."""
    if not reuse:
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        if not os.path.exists(cmd[0]):
            print(f"!! {name}: {cmd[0]} does not exist", flush=True)
            return None, f"{cmd[0]} does not exist"
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace")
        except OSError as e:
            print(f"!! {name} could not start: {e}", flush=True)
            return None, f"could not start: {e}"
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            sys.stdout.write((out or "")[-2000:])
            print(f"!! {name} did not finish within {timeout:.0f} s: left out", flush=True)
            return None, f"did not finish within {timeout:.0f} s"
        except BaseException:
            proc.kill()  # (Stopped, KeyboardInterrupt): no program outlives the comparison
            proc.wait()
            raise
        sys.stdout.write(stdout[-2000:])
        if proc.returncode != 0:
            print(f"!! {name} failed with exit code {proc.returncode}", flush=True)
            return None, f"exit code {proc.returncode}: {last_line(stdout)}"
    elif not os.path.exists(log):
        return None, f"no log {log}"
    try:
        lines = [json.loads(l) for l in open(log) if l.strip()]
    except (OSError, ValueError) as e:
        return None, f"unreadable log {os.path.basename(log)}: {e}"
    s = lines[-1] if lines else {}
    if not s.get("summary") or not isinstance(s.get("median"), (int, float)) or s["median"] <= 0:
        return None, f"no summary line in {os.path.basename(log)}"
    s["name"], s["command"] = name, " ".join(cmd)
    return s, None


def cell(value, fmt, suffix=""):
    """A table cell: the value formatted, or a dash where it was not measured."""
    return f"{value:{fmt}}{suffix}" if isinstance(value, (int, float)) else "—"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="vit-tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--tag", default="", help="appended to the output files' names (-TAG), to keep "
                   "an earlier run of the same day and model")
    p.add_argument("--skip", default="", help="comma-separated row names to leave out")
    p.add_argument("--python", default=VENV_PY, help="the Python that runs the peers")
    p.add_argument("--reuse", default="", help="build the report from the logs in this folder of an "
                   "earlier run instead of running again")
    p.add_argument("--rounds", type=int, default=1, help="run every program this many times, rotating the "
                   "order each round")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds one program may run; one that "
                   "takes longer is stopped and left out of the report")
    p.add_argument("--budget", type=float, default=None, help="seconds the whole comparison may take: each "
                   "program gets at most what is left, and one that cannot start in time is reported as "
                   "skipped; the report is rewritten after every program")
    p.add_argument("--isa", default="native", choices=["native", "avx2"],
                   help="avx2: every program capped at AVX2 (an AVX2-only CPU's configuration): kiln "
                   "built for x86-64-v3 (build-avx2/kiln) with oneDNN and oneMKL capped, PyTorch's "
                   "ATen, oneDNN and MKL capped, XLA capped (--xla_cpu_max_isa)")
    p.add_argument("--precision", default=None, choices=["tf32", "bf16"],
                   help="every program's matmul precision: tf32 (the reference experiment's; on the cpu: "
                   "plain f32) or bf16 (mixed precision); given, it names the output files (default: tf32 "
                   "on cuda, f32 on the cpu)")
    p.add_argument("--kiln", default="", help="the kiln binary (default: build/kiln, build-avx2/kiln for --isa avx2)")
    p.add_argument("--peak-gflops", type=float, default=None, help="the peak that MFU is computed against "
                   "(default: the FMA-loop peak kiln's runs measure; on a GPU, pass one)")
    args = p.parse_args()
    named_precision = args.precision is not None
    args.precision = args.precision or "tf32"
    if not os.path.exists(args.python):
        # kiln's rows are still measured; the peers' say why they are missing.
        print(f"bench/compare: the peers' Python {args.python} does not exist (bench/peers/setup_venv.sh "
              "makes one): the peers are left out", flush=True)
    skip = set(filter(None, args.skip.split(",")))
    tmp = args.reuse or tempfile.mkdtemp(prefix="kiln-compare-")
    reuse = bool(args.reuse)
    common = ["--model", args.model, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
    if args.rounds < 1:
        sys.exit("bench/compare: --rounds must be >= 1")
    kiln = args.kiln or os.path.join(ROOT, "build-avx2" if args.isa == "avx2" else "build", "kiln")
    if args.isa == "avx2":
        os.environ.update({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                           "ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2",
                           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                                         " --xla_cpu_max_isa=AVX2").strip()})
    programs = []  # (name, command without --log-json, is a peer)
    if args.device == "cpu":
        # The cpu has no tf32: f32, or bf16 mixed precision.
        prec = ["--precision", "bf16"] if args.precision == "bf16" else []
        for name, flags in [("kiln eager", ["--mode", "eager"]),
                            ("kiln eager + compile-model", ["--mode", "eager", "--compile-model"]),
                            ("kiln lazy", ["--mode", "lazy"]), ("kiln jit", ["--mode", "jit"])]:
            programs.append((name, [kiln, "train", *common, *prec, *flags], False))
    else:
        # kiln's three modes on the GPU, at the peers' precision.
        for name, flags in [("kiln eager", ["--mode", "eager"]), ("kiln lazy", ["--mode", "lazy"]),
                            ("kiln jit", ["--mode", "jit"])]:
            programs.append((name, [kiln, "train", *common, "--device", "cuda", "--precision",
                                    args.precision, *flags], False))
    peer_args = [*common, "--device", args.device, "--precision", args.precision]
    for name, script, flags in [("pytorch eager", "torch_vit.py", []),
                                ("torch.compile", "torch_vit.py", ["--compile"]),
                                ("jax jit", "jax_vit.py", [])]:
        programs.append((name, [args.python, os.path.join(PEERS, script), *peer_args, *flags], True))
    programs = [p for p in programs if p[0] not in skip]
    results = {name: [] for name, _, _ in programs}
    failures = {name: [] for name, _, _ in programs}

    def report(final):
        """Writes the tables from what has run so far (after every program: a run cut short keeps them)."""
        rows, failed = [], []
        for name, cmd, is_peer in programs:
            runs = results[name]
            if not runs:
                failed.append({"name": name, "command": " ".join(cmd), "peer_row": is_peer,
                               "reason": "; ".join(dict.fromkeys(failures[name])) or
                               ("not run" if final else "not run yet")})
                continue
            # The round whose median is the median of the rounds represents the row.
            runs_sorted = sorted(runs, key=lambda r: r["median"])
            r = dict(runs_sorted[(len(runs_sorted) - 1) // 2])
            r["median"] = statistics.median(x["median"] for x in runs)
            r["round_medians"] = [x["median"] for x in runs]
            r["peak_rss_mib"] = max((x.get("peak_rss_mib") or 0) for x in runs) or None
            if is_peer:
                r["peer_row"] = True
            rows.append(r)

        sys.path.insert(0, PEERS)
        import common as peer_common
        flops = (peer_common.train_flops_per_image(args.model) * args.batch_size
                 if args.model in peer_common.PRESETS else None)
        for r in rows:
            if flops and not r.get("flops_per_step"):
                r["flops_per_step"] = flops
        # The FMA-loop peak that every kiln run measures: the highest reading (a
        # reading taken while the shared VM was busy elsewhere is too low, and
        # would put MFU above 100%).
        peaks = [x["peak_gflops"] for runs in results.values() for x in runs if x.get("peak_gflops")]
        peak = args.peak_gflops or (max(peaks) if peaks else None)
        peak_source = ("given with --peak-gflops" if args.peak_gflops else "kiln's FMA-loop peak")
        peers = [r for r in rows if r.get("peer_row")]
        fastest = min(peers, key=lambda r: r["median"]) if peers else None
        for r in rows:
            r["vs_fastest_peer"] = fastest["median"] / r["median"] if fastest else None
            r["mfu"] = (r["flops_per_step"] / r["median"] / 1e9 / peak
                        if peak and r.get("flops_per_step") and r["median"] > 0 else None)
        date = datetime.date.today().isoformat()
        machine = cpu_model() if args.device == "cpu" else f"{gpu_model()} (host: {cpu_model()})"
        # Rotated multi-round runs get their own files beside single-round ones.
        stem = os.path.join(args.out, f"{date}-{args.device}-{args.model}"
                            + (f"-{args.precision}" if args.device == "cuda" or named_precision else "")
                            + (f"-rotated{args.rounds}" if args.rounds > 1 else "")
                            + (f"-{args.tag}" if args.tag else ""))
        meta = {"date": date, "device": args.device, "model": args.model, "batch_size": args.batch_size,
                "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "machine": machine,
                "cpus": os.cpu_count(),
                "command": f"bench/compare --model {args.model} --batch-size {args.batch_size} --steps {args.steps} "
                           f"--warmup {args.warmup} --device {args.device}"
                           + (f" --rounds {args.rounds}" if args.rounds > 1 else "")
                           + (f" --precision {args.precision}" if args.device == "cuda" or named_precision else "")
                           + (f" --peak-gflops {args.peak_gflops:g}" if args.peak_gflops else "")
                           + (f" --isa {args.isa}" if args.isa != "native" else "")
                           + (f" --skip '{args.skip}'" if args.skip else "")
                           + (f" --tag {args.tag}" if args.tag else ""),
                "logs": tmp,
                "precision": args.precision, "peak_gflops": peak, "rows": rows, "failed": failed}
        os.makedirs(args.out, exist_ok=True)
        # Keep every run's per-step log beside the report.
        logs = stem + "-logs"
        os.makedirs(logs, exist_ok=True)
        for f in os.listdir(tmp):
            if f.endswith(".jsonl"):
                shutil.copy(os.path.join(tmp, f), os.path.join(logs, f))
        meta["logs"] = os.path.relpath(logs, ROOT)
        write_atomically(stem + ".json", json.dumps(meta, indent=1))
        md = [f"# {args.model}, batch {args.batch_size}, {args.device}: kiln beside PyTorch and JAX\n",
              f"- date: {date}; machine: {machine}, {os.cpu_count()} CPUs",
              f"- command: `{meta['command']}` ({args.steps} steps, the first {args.warmup} untimed, "
              "one program after another, nothing else running"
              + (f"; {args.rounds} rounds, the order rotated each round; the median step is the median over "
                 "rounds" if args.rounds > 1 else "") + ")",
              *([f"- ISA capped at AVX2 for every program (kiln built for x86-64-v3; ONEDNN_MAX_CPU_ISA, "
                 "MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY=avx2, XLA_FLAGS=--xla_cpu_max_isa=AVX2)"]
                if args.isa == "avx2" else []),
              f"- MFU: matmul FLOPs per step / median step time / {peak:.0f} GFLOP/s ({peak_source})"
              if peak else "- MFU: no peak measured", "",
              "| run | median step | per round | p90 | images/s | time to first step | peak memory | MFU | speed vs fastest peer | reference formula |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            mem = r.get("peak_device_mib") or r.get("peak_rss_mib")
            per_round = ", ".join(f"{m:.3f}" for m in r["round_medians"])
            md.append(f"| {r['name']} | {r['median']:.3f} s | {per_round} | {cell(r.get('p90'), '.3f', ' s')} | "
                      f"{cell(r.get('images_per_second'), '.2f')} | {cell(r.get('first_step_seconds'), '.2f', ' s')} | "
                      f"{cell(mem / 1024 if mem else None, '.2f', ' GiB')} | "
                      f"{cell(r['mfu'] * 100 if r['mfu'] else None, '.1f', '%')} | "
                      f"{cell(r['vs_fastest_peer'], '.2f', 'x')} | {cell(r.get('reference_formula'), '.3f')} |")
        for f in failed:
            md.append(f"| {f['name']} | failed ({f['reason']}) |" + " — |" * 8)
        md.append("\n'speed vs fastest peer' = the fastest peer's median step / this row's (above 1: faster). "
                  "'reference formula' = what the reference script would print (sum of the timed steps / all "
                  "steps); for kiln it is not computed."
                  + ("" if fastest else " No peer was measured: no speed against one."))
        write_atomically(stem + ".md", "\n".join(md) + "\n")
        if not final:
            return failed
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
            names = [r["name"] for r in rows]
            vals = [r["median"] for r in rows]
            colors = ["#c0392b" if not r.get("peer_row") else "#7f8c8d" for r in rows]
            ax.barh(names[::-1], vals[::-1], color=colors[::-1])
            ax.set_xlabel("median step time (s), lower is better")
            ax.set_title(f"{args.model}, batch {args.batch_size}, {args.device}")
            fig.tight_layout()
            fig.savefig(stem + ".png", dpi=100)
        except Exception as e:  # noqa: BLE001 (a chart is a nicety: the tables are written already)
            print(f"no chart: {type(e).__name__}: {e}")
        print("\n".join(md))
        return failed

    deadline = time.monotonic() + args.budget if args.budget else None

    def stop(signum, frame):
        raise Stopped(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        for k in range(args.rounds):
            order = programs[k % len(programs):] + programs[:k % len(programs)]
            for name, cmd, _ in order:
                suffix = "" if args.rounds == 1 else f"-r{k + 1}"
                log = os.path.join(tmp, name.replace(" ", "_") + suffix + ".jsonl")
                timeout = args.run_timeout
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining < 15:
                        failures[name].append(f"skipped: {max(remaining, 0):.0f} s of the comparison's "
                                              f"{args.budget:g} s left")
                        continue
                    timeout = min(timeout or remaining, remaining - 5)
                s, why = run(name + (f" (round {k + 1})" if args.rounds > 1 else ""), [*cmd, "--log-json", log],
                             log, reuse, timeout)
                if s:
                    s["name"], s["command"] = name, " ".join(cmd)
                    results[name].append(s)
                else:
                    failures[name].append(why)
                report(final=False)
    except Stopped as e:
        for name in results:
            if not results[name] and not failures[name]:
                failures[name].append(str(e))
        print(f"bench/compare: {e}: the report holds what ran", flush=True)
        report(final=False)
        return 2

    failed = report(final=True)
    # The report is written whatever failed; the status says whether anything did.
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
