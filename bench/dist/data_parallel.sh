#!/usr/bin/env bash
# Data-parallel training on this machine: 2 ranks x 1 thread (mpirun) against
# 1 rank x 2 threads at the same global batch of 32 (jit), per model; the
# all-reduce time of the 2-rank runs, in all and exposed (not hidden behind
# the backward), with the default 25 MB buckets and with 4 MB ones; one rank
# alone at the local batch of 16 with one thread (the compute a rank does,
# for the scaling model's check); the all-reduce on its own on one host
# (shared memory) and across two hosts (two network namespaces joined by a
# veth pair, TCP), beside iperf3 on that link. Needs root for the namespaces.
#
#   bash bench/dist/data_parallel.sh OUT_DIR [models...]   (default: vit-tiny vit-small)
#   MODES="jit eager" ROUNDS=2 (the defaults: jit, two rounds)
#
# Writes OUT_DIR/*.jsonl and *.txt (every run's log and output), OUT_DIR/summary.md,
# and OUT_DIR/measured-<model>.json, which bench/dist/scaling_model.py --check reads.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: bench/dist/data_parallel.sh OUT_DIR [models...]}"
shift
models=("$@")
[ $# -eq 0 ] && models=(vit-tiny vit-small)
rounds=${ROUNDS:-2}
mkdir -p "$out"
bash scripts/build.sh kiln-cli kiln-bench-allreduce > /dev/null
command -v iperf3 > /dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1)

run() {  # NAME ROUND COMMAND...
  local name=$1 round=$2
  shift 2
  "$@" --log-json "$out/$name-r$round.jsonl" > "$out/$name-r$round.txt" 2>&1
}

modes=(${MODES:-jit})
for mode in "${modes[@]}"; do
for model in "${models[@]}"; do
  steps=10
  [ "$model" = vit-small ] && steps=8
  train=(build/kiln train --model "$model" --mode "$mode" --steps "$steps" --warmup 2)
  name=$model
  [ "$mode" = jit ] || name=$model-$mode
  for round in $(seq "$rounds"); do
    # Alternate the order, so that a slow spell of the machine falls on both.
    order=(one two two4 local)
    [ $((round % 2)) -eq 0 ] && order=(local two4 two one)
    for what in "${order[@]}"; do
      case $what in
        one) run "$name-1x2" "$round" "${train[@]}" --batch-size 32 --threads 2 ;;
        two) run "$name-2x1" "$round" "${mpi[@]}" "${train[@]}" --batch-size 32 --threads 1 ;;
        two4) run "$name-2x1-b4" "$round" "${mpi[@]}" "${train[@]}" --batch-size 32 --threads 1 \
                --bucket-mb 4 ;;
        local) run "$name-local" "$round" "${train[@]}" --batch-size 16 --threads 1 ;;
      esac
    done
  done
done
done

# The all-reduce alone: one host, then two hosts over the veth link with
# iperf3's view of the same link.
"${mpi[@]}" build/kiln-bench-allreduce 20 > "$out/allreduce-one-host.jsonl"
bash tests/dist/two_hosts.sh run bench "
  \$MPIRUN_TWO_HOSTS $PWD/build/kiln-bench-allreduce 10 > $out/allreduce-two-hosts.jsonl
  ip netns exec \$NS_B iperf3 -s -1 -D
  sleep 1
  iperf3 -c \$HOST_B -t 5 -J > $out/iperf3-two-hosts.json"

python3 - "$out" "${MODES:-jit}" "${models[@]}" << 'PY'
import json, statistics, sys
out, modes, models = sys.argv[1], sys.argv[2].split(), sys.argv[3:]

def summaries(name):
    found = []
    r = 1
    while True:
        try:
            lines = [json.loads(l) for l in open(f"{out}/{name}-r{r}.jsonl")]
        except FileNotFoundError:
            return found
        found.append(lines[-1])
        r += 1

def med(xs):
    return statistics.median(xs)

def fit(path):  # all-reduce time = latency + bytes / bandwidth, over the sizes >= 1 MB
    rows = [json.loads(l) for l in open(path)]
    big = [r for r in rows if r["bytes"] >= 1e6]
    n = len(big)
    mx = sum(r["bytes"] for r in big) / n
    my = sum(r["median_s"] for r in big) / n
    slope = sum((r["bytes"] - mx) * (r["median_s"] - my) for r in big) / sum((r["bytes"] - mx) ** 2 for r in big)
    return rows, 1 / slope, rows[0]["median_s"]

import datetime, platform, subprocess
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
L = ["# Data-parallel training on this machine", "",
     f"{datetime.date.today()}, {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} "
     f"cores; `MODES='{' '.join(modes)}' bash bench/dist/data_parallel.sh {out} {' '.join(models)}` (kiln "
     f"{subprocess.run(['git', 'log', '-1', '--format=%h'], capture_output=True, text=True).stdout.strip()}).", "",
     "2 ranks x 1 thread (`mpirun -np 2 ... --threads 1`) against 1 rank x 2 threads, global batch 32; "
     "medians over rounds of each run's median step (rounds alternate the order). "
     "All-reduce seconds are per timed step: in all (each exchange's start to end) and exposed "
     "(the step waited for it).", "",
     "| model | mode | 1x2 step | 2x1 step | throughput 2x1 / 1x2 | all-reduces per step | MB per step | all-reduce per step | exposed | 2x1, 4 MB buckets: step | all-reduce | exposed | 1 rank, batch 16, 1 thread |",
     "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
one_host, bw, lat = fit(f"{out}/allreduce-one-host.jsonl")
for mode, m in [(mode, m) for mode in modes for m in models]:
    name = m if mode == "jit" else f"{m}-{mode}"
    one, two, two4, local = (summaries(f"{name}-{k}") for k in ("1x2", "2x1", "2x1-b4", "local"))
    steps = 10 if m != "vit-small" else 8
    t = steps - 2
    per = lambda runs, key: med([s[key] / t for s in runs])
    a, b, b4, c = (med([s["median"] for s in r]) for r in (one, two, two4, local))
    n_ar = med([s["all_reduces"] / t for s in two])
    mb = med([s["all_reduce_bytes"] / t for s in two])
    L.append(f"| {m} | {mode} | {a:.3f} s | {b:.3f} s | **{a / b:.2f}** | {n_ar:.0f} | {mb / 1e6:.1f} | "
             f"{per(two, 'all_reduce_seconds') * 1e3:.0f} ms | {per(two, 'all_reduce_exposed_seconds') * 1e3:.0f} ms | "
             f"{b4:.3f} s | {per(two4, 'all_reduce_seconds') * 1e3:.0f} ms | "
             f"{per(two4, 'all_reduce_exposed_seconds') * 1e3:.0f} ms | {c:.3f} s |")
    measured = {"model": m if mode == "jit" else f"{m} ({mode})", "flops_per_image": one[0]["flops_per_step"] / 32,
                "params": int((mb - 4) / 4), "grad_bytes": mb - 4,
                "one_rank_two_threads_step_s": a, "two_ranks_one_thread_step_s": b,
                "per_rank_compute_s": c, "allreduce_bytes_per_s": bw, "allreduce_latency_s": lat,
                "measured_exposed_s": per(two, "all_reduce_exposed_seconds"),
                "measured_allreduce_s": per(two, "all_reduce_seconds"), "bucket_bytes": 25e6}
    json.dump(measured, open(f"{out}/measured-{name}.json", "w"), indent=1)

two_hosts, bw2, lat2 = fit(f"{out}/allreduce-two-hosts.jsonl")
ip = json.load(open(f"{out}/iperf3-two-hosts.json"))
link = ip["end"]["sum_received"]["bits_per_second"] / 8
L += ["", "## The all-reduce alone (`kiln-bench-allreduce`, 2 ranks, f32, median of 20 / 10)", "",
      "| bytes | one host (shared memory) | busbw | two hosts (veth, TCP) | busbw |", "|---|---|---|---|---|"]
for r1, r2 in zip(one_host, two_hosts):
    L.append(f"| {r1['bytes']:.0f} | {r1['median_s'] * 1e3:.3f} ms | {r1['busbw_GBps']:.2f} GB/s | "
             f"{r2['median_s'] * 1e3:.3f} ms | {r2['busbw_GBps']:.2f} GB/s |")
L += ["", f"Fit over >= 1 MB (time = latency + bytes / bandwidth): one host {bw / 1e9:.2f} GB/s, "
      f"two hosts {bw2 / 1e9:.2f} GB/s. iperf3 over the same veth link (one TCP stream, 5 s): "
      f"{link / 1e9:.2f} GB/s; the all-reduce's bus bandwidth across the two hosts is "
      f"{two_hosts[-1]['busbw_GBps'] * 1e9 / link * 100:.0f}% of it at 64 MB.", ""]
open(f"{out}/summary.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
for mode in "${modes[@]}"; do
  for m in "${models[@]}"; do
    name=$m
    [ "$mode" = jit ] || name=$m-$mode
    bench/peers/.venv/bin/python bench/dist/scaling_model.py --check "$out/measured-$name.json" \
      --out-md "$out/summary.md" > /dev/null
  done
done
