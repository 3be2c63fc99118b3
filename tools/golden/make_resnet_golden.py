#!/usr/bin/env python3
"""Writes the golden ResNet fixtures that tests/nn/resnet_golden_test.cpp
checks kiln against: small transformers ResNetForImageClassification models
(basic blocks; bottleneck blocks downsampling in the bottleneck and in the
first stage), their configs and weights (running statistics included), a
batch, and what PyTorch computes from them in training mode: logits, loss,
every gradient and the running statistics after that forward; the logits in
evaluation mode; and the losses of 5 SGD steps (momentum 0.9, weight decay
1e-4) with the running statistics they leave.

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_resnet_golden.py tests/fixtures
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import ResNetConfig, ResNetForImageClassification

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
STEPS = 5
CONFIGS = {
    "resnet_basic_golden": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[2, 1],
                                layer_type="basic", num_labels=10),
    "resnet_bottleneck_golden": dict(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 2],
                                     layer_type="bottleneck", downsample_in_bottleneck=True,
                                     downsample_in_first_stage=True, num_labels=10),
}


def make(out, name, kwargs, seed):
    out = os.path.join(out, name)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed)
    model = ResNetForImageClassification(ResNetConfig(**kwargs))
    with torch.no_grad():  # running statistics away from 0 and 1, weights larger
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    model.save_pretrained(out, safe_serialization=True)

    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([3, 0, 9, 3])
    save_file({"pixel_values": pixels.contiguous(),
               "pixel_values_nhwc": pixels.permute(0, 2, 3, 1).contiguous(),
               "labels": labels}, os.path.join(out, "batch.safetensors"))

    expected = {}
    model.eval()
    with torch.no_grad():
        expected["eval_logits"] = model(pixel_values=pixels).logits
    model.train()
    out_ = model(pixel_values=pixels, labels=labels)
    out_.loss.backward()
    expected["logits"] = out_.logits.detach()
    expected["loss"] = out_.loss.detach()
    for n, p in model.named_parameters():
        expected["grad." + n] = p.grad.detach().clone()
    for n, b in model.named_buffers():
        expected["state." + n] = b.detach().clone()

    opt = torch.optim.SGD(model.parameters(), **SGD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(pixel_values=pixels, labels=labels).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
    expected["sgd_losses"] = torch.tensor(losses, dtype=torch.float64)
    for n, b in model.named_buffers():
        expected["sgd_state." + n] = b.detach().clone()
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out, "expected.safetensors"),
              metadata={"sgd": str(SGD), "steps": str(STEPS), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__})
    print(name, "loss", out_.loss.item(), "sgd losses", losses)


def main(out):
    for seed, (name, kwargs) in enumerate(CONFIGS.items()):
        make(out, name, kwargs, seed)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
