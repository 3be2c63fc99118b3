#!/usr/bin/env python3
"""A training step of transformers' ResNetForImageClassification (ResNet-50,
ResNetConfig()) or ConvNextForImageClassification (ConvNeXt-T,
ConvNextConfig()) with PyTorch on random N(0,1) 224x224 images (or
--image-size), labels i % 1000, mean cross-entropy, SGD lr 1e-3, in training
mode (BatchNorm by the batch); eager or torch.compile, NCHW or channels_last
memory; on the CPU (autocast bf16) or a CUDA GPU (--device cuda: fp32 with
cuDNN's and cuBLAS's TF32 off, tf32 as PyTorch's defaults for convolutions
and with TF32 matmuls, or autocast bf16). A step is timed until its loss is
on the host. Prints one JSON line."""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import transformers

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--model", choices=["resnet-50", "convnext-tiny"], default="resnet-50")
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--compile", action="store_true")
p.add_argument("--channels-last", action="store_true")
p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
p.add_argument("--image-size", type=int, default=224)
a = p.parse_args()
if a.precision == "tf32" and a.device != "cuda":
    p.error("--precision tf32 is for --device cuda")
if a.device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.benchmark = True

torch.manual_seed(0)
if a.model == "resnet-50":
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig(num_labels=1000))
else:
    model = transformers.ConvNextForImageClassification(transformers.ConvNextConfig(num_labels=1000))
model.train()
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(a.device, memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
forward = torch.compile(model) if a.compile else model
x = torch.randn(a.batch_size, 3, a.image_size, a.image_size).contiguous(memory_format=fmt).to(a.device)
y = (torch.arange(a.batch_size) % 1000).to(a.device)
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        logits = forward(pixel_values=x).logits
    loss = loss_fn(logits.float(), y)
    loss.backward()
    opt.step()
    return loss.item()


times, losses = [], []
for i in range(a.steps):
    t0 = time.perf_counter()
    losses.append(step())
    times.append(time.perf_counter() - t0)
timed = times[a.warmup:]
print(json.dumps({"peer": "torch " + ("compile" if a.compile else "eager") +
                  (" channels_last" if a.channels_last else ""),
                  "model": a.model, "precision": a.precision, "batch_size": a.batch_size,
                  "device": a.device, "image_size": a.image_size,
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "threads": torch.get_num_threads(), "median": statistics.median(timed),
                  "min": min(timed), "max": max(timed), "first_step": times[0],
                  "losses": losses, "peak_rss_mib":
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20
                  if a.device == "cuda" else None}))
