#!/usr/bin/env python3
"""The reference experiment with PyTorch: transformers' ViTForImageClassification
(eager attention) on random N(0,1) NCHW images, labels i % 1000, mean
cross-entropy, SGD lr 1e-3; eager, or with --compile (torch.compile, inductor).
A step is timed only after its loss exists on the host (and the device is
synchronized)."""
import argparse

import torch
from transformers import ViTConfig, ViTForImageClassification

import common


def main():
    p = argparse.ArgumentParser(description=__doc__)
    common.add_common_args(p)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            common.fail("torch_vit: --device cuda but no CUDA device is visible")
        torch.backends.cuda.matmul.allow_tf32 = True  # the reference experiment's setting
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    config = ViTConfig(**common.vit_config_kwargs(args.model))
    config._attn_implementation = "eager"
    model = ViTForImageClassification(config).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    forward = torch.compile(model) if args.compile else model
    n = args.batch_size
    shape = common.preset(args.model)
    images = torch.randn(n, shape["num_channels"], shape["image_size"], shape["image_size"], device=dev)
    labels = torch.arange(n, device=dev) % shape["num_labels"]
    loss_fn = torch.nn.CrossEntropyLoss()

    bf16 = args.precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        # bf16: autocast's mixed precision (bf16 matmuls, f32 weights and loss).
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
            logits = forward(pixel_values=images).logits
        loss = loss_fn(logits.float(), labels)
        loss.backward()
        opt.step()
        return loss

    times, losses = [], []
    for i in range(args.steps):
        t0 = common.now()
        loss = step()
        value = loss.item()  # waits for the step's results
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(common.now() - t0)
        losses.append(value)
        print(f"step {i + 1}/{args.steps}  loss {value:.4f}  {times[-1]:.3f} s", flush=True)
    gpu = torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None
    name = "torch.compile" if args.compile else "pytorch eager"
    common.report(name, args, times, losses, times[0],
                  extra={"torch": torch.__version__, "threads": torch.get_num_threads()}, peak_gpu_mib=gpu)


if __name__ == "__main__":
    main()
