#!/usr/bin/env python3
"""Scaling model: kiln's data-parallel ViT-B/16 training on H200 GPUs.

Weak scaling (every GPU keeps `local_batch` images). Gradients are averaged in
buckets; each bucket's all-reduce starts once the backward has produced it and
the exchanges run one after another on one channel, overlapping the rest of the
backward. Prints a markdown report, writes it (--out-md) and a plot (--out-png).

  --check MEASURED.json  predicts a 2-rank CPU run with the same overlap model
                         and prints it beside the measurements.

Run: bench/peers/.venv/bin/python bench/dist/scaling_model.py [--check M.json]
"""
import argparse, json, math, os
import numpy as np

# ---- Assumptions (named, with sources) --------------------------------------
MB = 1e6                      # kiln's bucket_mb counts 1e6 bytes (src/train/step.cpp);
                              # PyTorch's bucket_cap_mb counts MiB (2^20): 5% apart
PEAK_BF16 = 989e12            # H200 SXM dense Tensor Core FLOP/s (NVIDIA H200 datasheet lists
PEAK_TF32 = 494e12            #   BF16 1979 / TF32 989 TFLOPS "with sparsity": half is dense)
MFU = 0.45                    # model FLOPs utilisation assumed for bf16 training
HBM_BW = 4.8e12               # H200 HBM3e bytes/s (datasheet)
OPT_PASSES = 3                # optimizer traffic: read param, read grad, write param
                              # (AdamW's moments would make it ~7 passes: still < 0.6 ms)
LOCAL_BATCH = 32              # images per GPU (the reference experiment's batch)
GPUS_PER_NODE = 8
NVL_BUSBW = 360e9             # achievable intra-node all-reduce bus bandwidth. NVLink 4 /
                              # NVSwitch: 900 GB/s bidirectional per GPU; typical NCCL
                              # all_reduce_perf busbw on 8xH100/H200: ~360-480 GB/s
NIC_BYTES = 400e9 / 8         # 400 Gb/s = 50 GB/s. ASSUMED: one NIC per GPU (rail-optimised,
                              # as DGX H200: 8x ConnectX-7 400 Gb/s). Pessimistic variant:
                              # one 400 Gb/s NIC per NODE, shared by its 8 GPUs
NET_FRACTION = 0.8            # achievable fraction of the NIC line rate
ALPHA_NVL = 5e-6              # latency per all-reduce step, NVLink
ALPHA_NET = 10e-6             # latency per all-reduce step, network
BWD_FRACTION = 2 / 3          # backward = 2x forward (kiln's FLOP count says the same)
BUCKETS_MB = [1, 5, 25, 100]
GPU_COUNTS = [1, 8, 64, 512]
TARGET = 0.90


# ---- Compute ----------------------------------------------------------------
def vit_train_flops(image=224, patch=16, ch=3, h=768, layers=12, inter=3072, labels=1000):
    """ViTConfig::train_flops_per_image (src/nn/vit.cpp), unpruned heads (a = h)."""
    n = (image // patch) ** 2
    t, a = n + 1, h
    patch_f = 2.0 * n * (ch * patch * patch) * h
    layer = 2.0 * t * h * 3 * a + 2.0 * 2 * t * t * a + 2.0 * t * a * h + 2.0 * 2 * t * h * inter
    forward = patch_f + layers * layer + 2.0 * h * labels
    return 3 * forward - patch_f  # backward = 2x forward; pixels need no gradient


def vit_params(image=224, patch=16, ch=3, h=768, layers=12, inter=3072, labels=1000):
    t = (image // patch) ** 2 + 1
    embed = ch * patch * patch * h + h + h + t * h          # patch conv, CLS token, positions
    layer = (3 * (h * h + h) + (h * h + h) + 2 * 2 * h      # q,k,v; output proj; 2 LayerNorms
             + h * inter + inter + inter * h + h)           # MLP
    return embed + layers * layer + 2 * h + h * labels + labels  # final LayerNorm, classifier


FLOPS = vit_train_flops()
PARAMS = vit_params()
assert PARAMS == 86_567_656, PARAMS
GRAD_BYTES = 4.0 * PARAMS     # f32 gradients (kiln keeps f32 master weights/grads in bf16 mode)


def compute_times(local_batch=None):
    """(T_fwd, T_bwd, T_opt) in seconds for one GPU's step (reads the constants above)."""
    t = (local_batch or LOCAL_BATCH) * FLOPS / (MFU * PEAK_BF16)
    return t * (1 - BWD_FRACTION), t * BWD_FRACTION, OPT_PASSES * 4.0 * PARAMS / HBM_BW


# ---- Network ----------------------------------------------------------------
def ring(S, n, bw, alpha):
    """Ring all-reduce of S bytes on n ranks, bw = NCCL 'busbw'."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * S / bw + 2 * (n - 1) * alpha


def net_bw(per_node_nic=False):
    """Network bytes/s available to each GPU's inter-node shard exchange."""
    return NIC_BYTES * NET_FRACTION / (GPUS_PER_NODE if per_node_nic else 1)


def allreduce_time(S, N, per_node_nic=False):
    """All-reduce of S bytes over N GPUs (8 per node when N > 8)."""
    if N <= GPUS_PER_NODE:
        return ring(S, N, NVL_BUSBW, ALPHA_NVL)
    g, nodes = GPUS_PER_NODE, N // GPUS_PER_NODE
    # Hierarchical (NCCL-like): intra-node reduce-scatter, inter-node all-reduce
    # of each GPU's S/8 shard among `nodes` peers, intra-node all-gather.
    intra = (g - 1) / g * S / NVL_BUSBW + (g - 1) * ALPHA_NVL       # each of RS and AG
    shard, bw = S / g, net_bw(per_node_nic)
    bw_term = 2 * (nodes - 1) / nodes * shard / bw
    # A ring has 2(n-1) latency steps (126 at 64 nodes); NCCL switches to
    # (double binary) trees at scale: 2*log2(n) steps, same bandwidth term.
    # The model takes the faster of the two.
    inter = bw_term + 2 * ALPHA_NET * min(nodes - 1, math.ceil(math.log2(nodes)))
    return 2 * intra + inter


# ---- Overlap of bucketed all-reduce with the backward ------------------------
def step(T_fwd, T_bwd, T_opt, S, bucket, ar):
    """Step time and exposed communication; ar(bytes) is one all-reduce's time.

    bucket=None: no overlap, one all-reduce of S after the backward. Otherwise
    nb = ceil(S/bucket) buckets (the last one holds the rest, as kiln's
    GradBuckets in src/train/buckets.h fills them), gradients are
    produced uniformly over the backward, so bucket i is ready when the
    backward has produced its bytes: T_fwd + cum_bytes_i/S * T_bwd (= (i+1)/nb
    for equal buckets; the last one at the backward's end). One channel:
    start_i = max(ready_i, end_{i-1}), end_i = start_i + ar(B_i).
    """
    compute = T_fwd + T_bwd
    if bucket is None:
        total = compute + ar(S) + T_opt
        return total, total - compute - T_opt, ar(S)
    nb = max(1, math.ceil(S / bucket - 1e-9))
    sizes = [bucket] * (nb - 1) + [S - bucket * (nb - 1)]
    end, cum, busy = 0.0, 0.0, 0.0
    for b in sizes:
        cum += b
        ready = T_fwd + cum / S * T_bwd
        t = ar(b)
        end, busy = max(ready, end) + t, busy + t
    total = max(compute, end) + T_opt
    return total, total - compute - T_opt, busy


def scaling(N, bucket_mb, local_batch=None, per_node_nic=False):
    """(step_s, exposed_s, efficiency) for N GPUs; bucket_mb None = no overlap."""
    T = compute_times(local_batch)
    one = sum(T)  # 1 GPU: no communication
    if N == 1:
        return one, 0.0, 1.0
    ar = lambda b: allreduce_time(b, N, per_node_nic)
    s, exp, _ = step(*T, GRAD_BYTES, None if bucket_mb is None else bucket_mb * MB, ar)
    return s, exp, one / s


# ---- Report -------------------------------------------------------------------
def ok_range(N, per_node_nic, scan):
    """Bucket sizes with efficiency >= TARGET, as intervals of the scan."""
    eff = np.array([scaling(N, b, per_node_nic=per_node_nic)[2] for b in scan])
    best = f"best {eff.max():.1%} at {scan[eff.argmax()]:.3g} MB"
    runs, i = [], 0
    while i < len(scan):
        if eff[i] >= TARGET:
            j = i
            while j + 1 < len(scan) and eff[j + 1] >= TARGET:
                j += 1
            runs.append(f"{scan[i]:.3g}" + (f"–{scan[j]:.3g}" if j > i else ""))
            i = j
        i += 1
    return (", ".join(runs) + " MB" if runs else "none") + f" ({best})"


def sensitivity(N=512, bucket_mb=25):
    """Efficiency at N GPUs (NIC per GPU) with one assumption changed at a time."""
    cases = [("as above", {}), ("NVLink busbw 480 GB/s", {"NVL_BUSBW": 480e9}),
             ("alpha NVLink 1 us", {"ALPHA_NVL": 1e-6}), ("alpha network 5 us", {"ALPHA_NET": 5e-6}),
             ("network fraction 0.6", {"NET_FRACTION": 0.6}), ("MFU 0.30", {"MFU": 0.30}),
             ("MFU 0.60", {"MFU": 0.60}), ("tf32 (peak 494, MFU 0.45)", {"PEAK_BF16": PEAK_TF32})]
    rows = []
    for name, change in cases:
        saved = {k: globals()[k] for k in change}
        globals().update(change)  # the model reads the module constants at call time
        s, e, eff = scaling(N, bucket_mb)
        rows.append(f"| {name} | {s*1e3:.2f} | {e*1e3:.2f} | {eff:.1%} | {scaling(N, None)[2]:.1%} |")
        globals().update(saved)
    return rows


def min_batch(N=512, bucket_mb=25, per_node_nic=False, limit=4096):
    for b in range(1, limit + 1):
        if scaling(N, bucket_mb, b, per_node_nic)[2] >= TARGET:
            return b
    return None


def report():
    Tf, Tb, To = compute_times()
    L = ["# Scaling model: data-parallel ViT-B/16 on H200 (kiln, bucketed all-reduce)", "",
         "Written by `bench/dist/scaling_model.py` (a model, not a measurement).", "",
         "## Inputs", "",
         f"- training FLOPs/image (kiln `ViTConfig::train_flops_per_image`): {FLOPS/1e9:.2f} GFLOP",
         f"- parameters: {PARAMS:,}; f32 gradient bytes S = {GRAD_BYTES/MB:.1f} MB",
         f"- compute per GPU, batch {LOCAL_BATCH}, bf16 peak {PEAK_BF16/1e12:.0f} TFLOP/s x MFU {MFU}: "
         f"forward {Tf*1e3:.2f} ms, backward {Tb*1e3:.2f} ms, optimizer {To*1e3:.2f} ms "
         f"({OPT_PASSES} passes over f32 params at {HBM_BW/1e12:.1f} TB/s)"
         f" (tf32 peak {PEAK_TF32/1e12:.0f} TFLOP/s would double compute time)",
         f"- intra-node: ring, busbw {NVL_BUSBW/1e9:.0f} GB/s, alpha {ALPHA_NVL*1e6:.0f} us/step",
         f"- inter-node: hierarchical (reduce-scatter in node, all-reduce of S/8 between nodes, "
         f"all-gather in node), min(ring, tree) latency, alpha {ALPHA_NET*1e6:.0f} us/step; "
         f"per-GPU NIC {net_bw()/1e9:.0f} GB/s (400 Gb/s x {NET_FRACTION}, ASSUMED one NIC per GPU); "
         f"pessimistic: one 400 Gb/s NIC per node = {net_bw(True)/1e9:.2f} GB/s per GPU",
         "- buckets fill uniformly over the backward; exchanges serialised on one channel", ""]
    for per_node, title in ((False, "one 400 Gb/s NIC per GPU"), (True, "one 400 Gb/s NIC per node (pessimistic)")):
        L += [f"## Weak scaling, {title}", "",
              "| GPUs | buckets | step (ms) | exposed comm (ms) | all-reduce of S alone (ms) | efficiency |",
              "|---:|---|---:|---:|---:|---:|"]
        for N in GPU_COUNTS:
            full = allreduce_time(GRAD_BYTES, N, per_node) * 1e3 if N > 1 else 0.0
            for bm in (BUCKETS_MB + [None]) if N > 1 else [None]:
                s, e, eff = scaling(N, bm, per_node_nic=per_node)
                name = "—" if N == 1 else ("one after backward" if bm is None else f"{bm} MB")
                L.append(f"| {N} | {name} | {s*1e3:.2f} | {e*1e3:.2f} | {full:.2f} | {eff:.1%} |")
        L.append("")
    scan = np.geomspace(0.25, 400, 241)
    L += [f"## Bucket sizes keeping efficiency >= {TARGET:.0%} (scan 0.25–400 MB, 241 log-spaced)", "",
          "| GPUs | NIC per GPU | NIC per node |", "|---:|---|---|"]
    for N in GPU_COUNTS[1:]:
        L.append(f"| {N} | {ok_range(N, False, scan)} | {ok_range(N, True, scan)} |")
    L += ["", f"## Sensitivity: 512 GPUs, NIC per GPU, {LOCAL_BATCH} img/GPU, one change at a time", "",
          "| change | step, 25 MB (ms) | exposed (ms) | efficiency, 25 MB | efficiency, no overlap |",
          "|---|---:|---:|---:|---:|"] + sensitivity()
    mb_gpu, mb_node = min_batch(per_node_nic=False), min_batch(per_node_nic=True)
    L += ["", f"Minimum local batch per GPU for >= {TARGET:.0%} at 512 GPUs, 25 MB buckets: "
          f"{mb_gpu} (NIC per GPU), {mb_node} (NIC per node).", "",
          "Caveats: compute is not slowed by the concurrent all-reduce (NCCL kernels do take "
          "SMs and HBM bandwidth); no stragglers or jitter; buckets fill uniformly in bytes "
          "(in truth per layer, in reverse order); MFU held fixed at every batch size. "
          "Small buckets are ruled by the latency terms (2(n-1) alpha per phase: 190 us per "
          "bucket at 512 GPUs), which NCCL's pipelined LL/LL128 protocols can beat; "
          "efficiency at 512 GPUs is marginal either side of 90% and moves with every "
          "parameter (see the sensitivity table).", ""]
    return "\n".join(L)


def plot(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    Ns = [2 ** k for k in range(10)]
    for bm in BUCKETS_MB + [None]:
        a1.plot(Ns, [scaling(N, bm)[2] * 100 for N in Ns], marker="o", ms=3,
                ls="--" if bm is None else "-", label="no overlap" if bm is None else f"{bm} MB")
    a1.set(xscale="log", xlabel="GPUs (8 per node)", ylabel="weak-scaling efficiency (%)",
           title=f"ViT-B/16, {LOCAL_BATCH} img/GPU, NIC per GPU")
    a1.set_xscale("log", base=2)
    a1.set_xticks(Ns, [str(n) for n in Ns])
    scan = np.geomspace(0.25, 400, 121)
    for per_node, lab in ((False, "NIC per GPU"), (True, "NIC per node")):
        a2.plot(scan, [scaling(512, b, per_node_nic=per_node)[2] * 100 for b in scan], label=lab)
        a2.axhline(scaling(512, None, per_node_nic=per_node)[2] * 100, ls=":", lw=1,
                   color=a2.lines[-1].get_color(), label=lab + ", no overlap")
    a2.set(xscale="log", xlabel="bucket size (MB)", ylabel="efficiency (%)", title=f"512 GPUs, {LOCAL_BATCH} img/GPU")
    for ax in (a1, a2):
        ax.axhline(TARGET * 100, color="grey", lw=0.8)
        ax.annotate(f"{TARGET:.0%}", (1.0, TARGET * 100), xycoords=("axes fraction", "data"),
                    xytext=(-22, 3), textcoords="offset points", fontsize=8, color="grey")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


# ---- Check against a 2-rank CPU measurement ------------------------------------
def check(path):
    m = json.load(open(path))
    bf = m.get("backward_fraction", 2 / 3)
    # Each of the 2 ranks computes half the batch with one thread: its compute
    # is the step of one process alone at that local batch and thread count
    # (measured; optimizer included, unsplit).
    c = m["per_rank_compute_s"]
    bw, lat = m["allreduce_bytes_per_s"], m["allreduce_latency_s"]
    # 2 ranks, ring, one level; at 2 ranks busbw = algbw = bytes / time.
    ar = lambda b: ring(b, 2, bw, lat)
    s, exp, busy = step(c * (1 - bf), c * bf, 0.0, m["grad_bytes"], m["bucket_bytes"], ar)
    s0, exp0, _ = step(c * (1 - bf), c * bf, 0.0, m["grad_bytes"], None, ar)
    base = m["one_rank_two_threads_step_s"]
    rows = [("2-rank step (s)", s, m["two_ranks_one_thread_step_s"]),
            ("exposed all-reduce per step (s)", exp, m["measured_exposed_s"]),
            ("all-reduce time per step (s)", busy, m["measured_allreduce_s"]),
            ("throughput 2 ranks x 1 thread / 1 rank x 2 threads", base / s,
             base / m["two_ranks_one_thread_step_s"])]
    L = [f"## Check against measurement: {m.get('model', '?')}, 2 ranks on this CPU", "",
         f"`{path}`: {m['flops_per_image']/1e9:.2f} GFLOP/image, {m['params']:,} params, {m['grad_bytes']/MB:.2f} MB gradients, "
         f"buckets of {m['bucket_bytes']/MB:.2f} MB, all-reduce {bw/1e9:.2f} GB/s + "
         f"{lat*1e6:.0f} us/step, backward fraction {bf:.3f}. Model compute per rank = "
         f"{c:.4g} s, the measured step of one process alone at the local batch with one thread; "
         f"the all-reduce is assumed not to slow the compute (on 2 cores it may).", "",
         "| quantity | predicted | measured |", "|---|---:|---:|"]
    L += [f"| {k} | {p:.4g} | {q:.4g} |" for k, p, q in rows]
    L += ["", f"Without overlap the model predicts a {s0:.4g} s step ({exp0:.4g} s exposed).", ""]
    return "\n".join(L)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-md", help="default: bench/results/2026-12-01-dist-scaling-model.md; "
                    "with --check, appended to only when given")
    ap.add_argument("--out-png", default=os.path.join(root, "docs/dist-scaling.png"))
    ap.add_argument("--check", metavar="MEASURED.json")
    a = ap.parse_args()
    if a.check:
        text = check(a.check)
        print(text)
        if a.out_md:
            with open(a.out_md, "a") as f:
                f.write("\n" + text)
        return
    print(f"ViT-B/16 training FLOPs per image: {FLOPS:,.0f}; parameters: {PARAMS:,}\n")
    text = report()
    print(text)
    a.out_md = a.out_md or os.path.join(root, "bench/results/2026-12-01-dist-scaling-model.md")
    if a.out_md:
        os.makedirs(os.path.dirname(os.path.abspath(a.out_md)), exist_ok=True)
        open(a.out_md, "w").write(text)
    if a.out_png:
        plot(a.out_png)


if __name__ == "__main__":
    main()
