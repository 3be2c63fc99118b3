#!/usr/bin/env python3
"""A training step of transformers' GPT2LMHeadModel (GPT-2 124M, the config
of bench/lm/gpt2_124m.json: GPT2Config() without dropout, as llm.c trains it)
with PyTorch on random tokens (batch B x T), labels = input_ids (shifted
inside), AdamW lr 1e-4; eager or torch.compile; fp32 or bf16 autocast on the
CPU. A step is timed until its loss is on the host. Prints one JSON line.

    python bench/lm/torch_gpt2.py [--compile] [--precision bf16] [--steps 6]
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import transformers

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--seq-len", type=int, default=1024)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--compile", action="store_true")
p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
a = p.parse_args()

torch.manual_seed(0)
with open(os.path.join(os.path.dirname(__file__), "gpt2_124m.json")) as f:
    cfg = {k: v for k, v in json.load(f).items() if k not in ("model_type", "architectures")}
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
forward = torch.compile(model) if a.compile else model
ids = torch.randint(0, cfg["vocab_size"], (a.batch_size, a.seq_len))


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        loss = forward(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return loss.item()


times, losses = [], []
for i in range(a.steps):
    t0 = time.perf_counter()
    losses.append(step())
    times.append(time.perf_counter() - t0)
timed = times[a.warmup:]
print(json.dumps({"peer": "torch " + ("compile" if a.compile else "eager"), "model": "gpt2-124m",
                  "precision": a.precision, "batch_size": a.batch_size, "seq_len": a.seq_len,
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "threads": torch.get_num_threads(), "median": statistics.median(timed),
                  "min": min(timed), "max": max(timed), "first_step": times[0],
                  "losses": losses,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
