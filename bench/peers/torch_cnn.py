#!/usr/bin/env python3
"""A training step of transformers' ResNetForImageClassification (ResNet-50,
ResNetConfig()) or ConvNextForImageClassification (ConvNeXt-T,
ConvNextConfig()) with PyTorch on random N(0,1) 224x224 images, labels
i % 1000, mean cross-entropy, SGD lr 1e-3, in training mode (BatchNorm by
the batch); eager or torch.compile, NCHW or channels_last memory. A step is
timed until its loss is on the host. Prints one JSON line."""
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
p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
a = p.parse_args()

torch.manual_seed(0)
if a.model == "resnet-50":
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig(num_labels=1000))
else:
    model = transformers.ConvNextForImageClassification(transformers.ConvNextConfig(num_labels=1000))
model.train()
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
forward = torch.compile(model) if a.compile else model
x = torch.randn(a.batch_size, 3, 224, 224).contiguous(memory_format=fmt)
y = torch.arange(a.batch_size) % 1000
loss_fn = torch.nn.CrossEntropyLoss()


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
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
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "threads": torch.get_num_threads(), "median": statistics.median(timed),
                  "min": min(timed), "max": max(timed), "first_step": times[0],
                  "losses": losses, "peak_rss_mib":
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
