#!/usr/bin/env python3
"""Writes the fine-tuning golden fixture that tests/optim/finetune_test.cpp
checks kiln against (one safetensors file):

- `lr.linear`: the learning rate of each of 10 optimizer steps under
  transformers' get_linear_schedule_with_warmup (3 warm-up steps) in a torch
  LambdaLR, base lr 1 (the HF Trainer's default schedule);
- `smooth.logits`, `smooth.labels`, `smooth.loss`, `smooth.grad`:
  torch.nn.CrossEntropyLoss(label_smoothing=0.1) of logits [6, 7] and its
  gradient;
- `decay.<optimizer>.<step>.<name>`: torch AdamW and SGD (momentum 0.9) with
  two parameter groups as the HF Trainer builds them (weight decay 0.1, none
  for biases, LayerNorm weights, the position embeddings and the [CLS]
  token), 3 steps from `decay.init.<name>` with gradients `decay.grad.<step>.<name>`.

    bench/peers/.venv-gpu-machine/bin/python tools/golden/make_finetune_golden.py tests/fixtures/finetune_golden.safetensors
"""
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import get_linear_schedule_with_warmup

NAMES = {  # transformers names of a ViT, small shapes
    "vit.embeddings.cls_token": (1, 1, 4),
    "vit.embeddings.position_embeddings": (1, 3, 4),
    "vit.encoder.layer.0.attention.attention.query.weight": (4, 4),
    "vit.encoder.layer.0.attention.attention.query.bias": (4,),
    "vit.encoder.layer.0.layernorm_before.weight": (4,),
    "vit.layernorm.bias": (4,),
    "classifier.weight": (3, 4),
    "classifier.bias": (3,),
}


def no_decay(name):
    return name.endswith(".bias") or "layernorm" in name or name.endswith("position_embeddings") or \
        name.endswith("cls_token")


def main(out):
    t = {}
    # The linear schedule.
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    t["lr.linear"] = torch.tensor(lrs, dtype=torch.float64)

    # Label smoothing.
    torch.manual_seed(0)
    logits = (torch.randn(6, 7) * 2).requires_grad_()
    labels = torch.randint(0, 7, (6,))
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(logits, labels)
    loss.backward()
    t["smooth.logits"] = logits.detach().clone()
    t["smooth.labels"] = labels.to(torch.int32)
    t["smooth.loss"] = loss.detach().reshape(())
    t["smooth.grad"] = logits.grad.clone()

    # Weight decay in two groups, AdamW and SGD with momentum.
    init = {n: torch.randn(s) for n, s in NAMES.items()}
    grads = [{n: torch.randn(s) for n, s in NAMES.items()} for _ in range(3)]
    for n, v in init.items():
        t[f"decay.init.{n}"] = v.clone()
    for k, g in enumerate(grads):
        for n, v in g.items():
            t[f"decay.grad.{k}.{n}"] = v.clone()
    for kind in ("adamw", "sgd"):
        params = {n: torch.nn.Parameter(v.clone()) for n, v in init.items()}
        groups = [{"params": [p for n, p in params.items() if not no_decay(n)], "weight_decay": 0.1},
                  {"params": [p for n, p in params.items() if no_decay(n)], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=0.01, foreach=False) if kind == "adamw" else \
            torch.optim.SGD(groups, lr=0.01, momentum=0.9, foreach=False)
        for k, g in enumerate(grads):
            for n, p in params.items():
                p.grad = g[n].clone()
            opt.step()
            for n, p in params.items():
                t[f"decay.{kind}.{k}.{n}"] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in t.items()}, out,
              metadata={"torch": torch.__version__, "transformers": transformers.__version__})
    print(len(t), "tensors; torch", torch.__version__, "transformers", transformers.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
