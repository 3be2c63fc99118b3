#!/usr/bin/env python3
"""Writes the optimizer golden fixture that tests/optim/optim_test.cpp checks
kiln against: torch.optim.AdamW over 6 steps with a warm-up + cosine LambdaLR
and clip_grad_norm_, from fixed parameters and a fixed gradient per step.

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_optim_golden.py tests/fixtures/optim_golden
"""
import math
import os
import sys

import torch
from safetensors.torch import save_file

STEPS, WARMUP = 6, 2
ADAMW = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
MAX_NORM = 1.5


def factor(k):  # kiln's Schedule{cosine, WARMUP, STEPS}
    if k < WARMUP:
        return (k + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * min((k - WARMUP) / (STEPS - WARMUP), 1.0)))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    shapes = {"a": (3, 4), "b": (5,), "c": (2, 2, 2)}
    params = {n: torch.randn(s, dtype=torch.float32) for n, s in shapes.items()}
    tensors = {f"param/{n}": p.clone() for n, p in params.items()}
    model = {n: torch.nn.Parameter(p.clone()) for n, p in params.items()}
    opt = torch.optim.AdamW(list(model.values()), foreach=False, **ADAMW)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    norms = []
    for step in range(STEPS):
        for n, p in model.items():
            g = torch.randn(shapes[n]) * (3.0 if step % 2 else 0.2)  # some steps clip, some not
            tensors[f"grad/{step}/{n}"] = g.clone()
            p.grad = g
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(model.values()), MAX_NORM)))
        opt.step()
        sched.step()
        for n, p in model.items():
            tensors[f"after/{step}/{n}"] = p.detach().clone()
    tensors["norms"] = torch.tensor(norms, dtype=torch.float64)
    tensors["lr_factors"] = torch.tensor([factor(k) for k in range(STEPS)], dtype=torch.float64)
    save_file(tensors, os.path.join(out, "adamw.safetensors"),
              metadata={"torch": torch.__version__, "steps": str(STEPS), "warmup": str(WARMUP),
                        "lr": str(ADAMW["lr"]), "weight_decay": str(ADAMW["weight_decay"]),
                        "max_norm": str(MAX_NORM)})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/optim_golden")
