#!/usr/bin/env python3
"""The Fashion-MNIST run of `kiln train --data fashion-mnist`, with PyTorch and
transformers' ViTForImageClassification: the same config (kiln's vit-fmnist
preset), AdamW, warm-up + cosine schedule (a LambdaLR with kiln's formula),
batch size, flips and normalization. Writes a JSON-lines log in kiln's schema
(step/loss/lr lines, eval_loss/eval_accuracy lines, a summary), which
`kiln plot` draws.

    bench/peers/.venv/bin/python bench/peers/torch_fmnist.py --epochs 8 --log-json out.jsonl
"""
import argparse
import gzip
import json
import math
import os
import time

import numpy as np
import torch
from transformers import ViTConfig, ViTForImageClassification

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # kiln's FashionMnistOptions defaults


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(f"{DATA}/{prefix}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = read_idx(f"{DATA}/{prefix}-labels-idx1-ubyte.gz", 8)
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--lr-warmup", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=468)
    ap.add_argument("--augment", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = ViTConfig(hidden_size=128, num_hidden_layers=6, num_attention_heads=4, intermediate_size=256,
                    image_size=28, patch_size=7, num_channels=1, num_labels=10, hidden_act="gelu",
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
                    initializer_range=0.02, qkv_bias=True, attn_implementation="eager")
    model = ViTForImageClassification(cfg)
    xtr, ytr = load("train")
    xte, yte = load("test")
    per_epoch = len(xtr) // args.batch_size
    total = args.epochs * per_epoch

    def factor(k):  # kiln's optim::Schedule{cosine, warmup, total}
        if k < args.lr_warmup:
            return (k + 1) / args.lr_warmup
        return 0.5 * (1 + math.cos(math.pi * min((k - args.lr_warmup) / (total - args.lr_warmup), 1.0)))

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    log = open(args.log_json, "w") if args.log_json else None
    gen = torch.Generator().manual_seed(args.seed)

    def evaluate(step):
        model.eval()
        loss, hits, t0 = 0.0, 0, time.perf_counter()
        with torch.no_grad():
            for i in range(0, len(xte), 256):
                logits = model(pixel_values=xte[i:i + 256]).logits
                loss += torch.nn.functional.cross_entropy(logits, yte[i:i + 256], reduction="sum").item()
                hits += (logits.argmax(-1) == yte[i:i + 256]).sum().item()
        model.train()
        r = {"step": step, "eval_loss": loss / len(xte), "eval_accuracy": hits / len(xte),
             "eval_samples": len(xte), "eval_seconds": time.perf_counter() - t0}
        print(f"eval at step {step}: loss {r['eval_loss']:.4f}, accuracy {100 * r['eval_accuracy']:.2f}%", flush=True)
        if log:
            log.write(json.dumps(r) + "\n")
        return r

    print(f"torch {torch.__version__}, {args.threads} threads; {total} steps of {args.batch_size}", flush=True)
    start = time.perf_counter()
    step, last = 0, None
    model.train()
    for epoch in range(args.epochs):
        order = torch.randperm(len(xtr), generator=gen)
        for b in range(per_epoch):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = xtr[idx], ytr[idx]
            if args.augment:
                flip = torch.rand(len(x), generator=gen) < 0.5
                x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            t0 = time.perf_counter()
            lr = opt.param_groups[0]["lr"]
            loss = torch.nn.functional.cross_entropy(model(pixel_values=x).logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if log:
                log.write(json.dumps({"step": step, "loss": loss.item(), "lr": lr,
                                      "step_time": time.perf_counter() - t0}) + "\n")
            if step % 100 == 0:
                print(f"step {step}/{total}  loss {loss.item():.4f}  lr {lr:.3g}", flush=True)
            if args.eval_every and step % args.eval_every == 0 and step != total:
                evaluate(step)
    last = evaluate(total)
    wall = time.perf_counter() - start
    print(f"final test accuracy {100 * last['eval_accuracy']:.2f}% after {total} steps; wall time {wall:.1f} s")
    if log:
        log.write(json.dumps({"summary": True, "eval_accuracy": last["eval_accuracy"],
                              "eval_loss": last["eval_loss"], "wall_seconds": wall,
                              "torch": torch.__version__}) + "\n")


if __name__ == "__main__":
    main()
