#!/usr/bin/env python3
"""Per-op time of PyTorch's eager ViT training step (torch.profiler), to set
beside `KILN_PROFILE=1 kiln train`: the same model, batch and optimizer as
torch_vit.py; a few warm-up steps, then the profiled ones."""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import ViTConfig, ViTForImageClassification

import common


def main():
    p = argparse.ArgumentParser(description=__doc__)
    common.add_common_args(p)
    p.add_argument("--rows", type=int, default=15)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    config = ViTConfig(**common.vit_config_kwargs(args.model))
    config._attn_implementation = "eager"
    model = ViTForImageClassification(config).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    images = torch.randn(args.batch_size, 3, 224, 224)
    labels = torch.arange(args.batch_size) % 1000

    def step():
        opt.zero_grad(set_to_none=True)
        # bf16: autocast's mixed precision, as torch_vit.py runs it.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(pixel_values=images).logits
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    timed = args.steps - args.warmup
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(timed):
            step()
    mode = "autocast bf16" if args.precision == "bf16" else "f32"
    print(f"PyTorch {torch.__version__} eager ({mode}), {args.model}, {timed} profiled steps, self CPU time:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
