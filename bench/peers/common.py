"""Shared by the peers: kiln's presets, step statistics in kiln's JSON schema."""
import json
import resource
import statistics
import sys
import time

PRESETS = {
    "vit-tiny": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    "vit-small": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "vit-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "vit-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    # Fashion-MNIST's 28x28 grey images in 10 classes: small enough for rehearsals.
    "vit-fmnist": dict(hidden_size=128, num_hidden_layers=6, num_attention_heads=4, intermediate_size=256,
                       image_size=28, patch_size=7, num_channels=1, num_labels=10),
}
# transformers' ViTConfig() where a preset says nothing else: 224x224 RGB, patch 16, 1000 labels.
IMAGES = dict(image_size=224, patch_size=16, num_channels=3, num_labels=1000)


def preset(model):
    """A kiln preset's architecture and image fields."""
    return {**IMAGES, **PRESETS[model]}


def vit_config_kwargs(model):
    """transformers' ViTConfig() fields of a kiln preset."""
    kw = preset(model)
    kw.update(hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
              initializer_range=0.02, qkv_bias=True)
    return kw


def train_flops_per_image(model):
    """Matmul FLOPs of one training step per image: 3 x forward, less the pixel gradient (as kiln)."""
    p = preset(model)
    n = (p["image_size"] // p["patch_size"]) ** 2
    t, h, i = n + 1.0, p["hidden_size"], p["intermediate_size"]
    patch = 2.0 * n * (p["num_channels"] * p["patch_size"] ** 2) * h
    layer = 2 * t * h * 3 * h + 2 * 2 * t * t * h + 2 * t * h * h + 2 * 2 * t * h * i
    forward = patch + p["num_hidden_layers"] * layer + 2.0 * h * p["num_labels"]
    return 3 * forward - patch


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def percentile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def report(name, args, times, losses, first_step, extra=None, peak_gpu_mib=None):
    """Prints kiln's statistics and the reference script's own formula; writes JSON lines."""
    timed = times[args.warmup:]
    summary = {
        "summary": True, "peer": name, "model": args.model, "batch_size": args.batch_size,
        "device": args.device, "steps": args.steps, "warmup": args.warmup,
        "precision": args.precision if args.device == "cuda" or args.precision == "bf16" else "fp32",
        "mean": statistics.mean(timed), "median": statistics.median(timed),
        "p90": percentile(timed, 0.9), "min": min(timed), "max": max(timed),
        "images_per_second": args.batch_size / statistics.mean(timed),
        "data_wait_share": 0.0,
        "first_step_seconds": first_step,
        "peak_rss_mib": peak_rss_mib(),
        # The reference script sums the timed steps and divides by all steps.
        "reference_formula": sum(timed) / args.steps,
        "flops_per_step": train_flops_per_image(args.model) * args.batch_size,
    }
    if peak_gpu_mib is not None:
        summary["peak_device_mib"] = peak_gpu_mib
    if extra:
        summary.update(extra)
    print(f"average step time: {summary['mean']:.6f}")
    print(f"median {summary['median']:.3f} s, p90 {summary['p90']:.3f} s over {len(timed)} timed steps; "
          f"{summary['images_per_second']:.2f} images/s; first step {first_step:.2f} s; "
          f"peak RSS {summary['peak_rss_mib']:.0f} MiB")
    print(f"the reference script's formula (sum of timed steps / all steps) would print: "
          f"{summary['reference_formula']:.6f}")
    if args.log_json:
        with open(args.log_json, "w") as f:
            for i, (t, l) in enumerate(zip(times, losses)):
                f.write(json.dumps({"step": i + 1, "loss": l, "step_time": t, "timed": i >= args.warmup}) + "\n")
            f.write(json.dumps(summary) + "\n")
    return summary


def add_common_args(p):
    p.add_argument("--model", default="vit-base", choices=sorted(PRESETS))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="tf32", choices=["tf32", "bf16"],
                   help="tf32 matmuls (the reference experiment's; plain f32 on the cpu), or bf16 mixed "
                   "precision (bf16 matmuls, f32 master weights: torch.autocast, flax dtype=bfloat16)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-json", default="")


def now():
    return time.perf_counter()


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)
