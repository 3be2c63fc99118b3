#!/usr/bin/env python3
"""Writes the golden ConvNeXt fixture that tests/nn/convnext_golden_test.cpp
checks kiln against: a small transformers ConvNextForImageClassification (3
stages, layer scale), its config and weights, a batch, and what PyTorch
computes from them: logits, loss, every gradient, and the losses of 5 SGD
steps (momentum 0.9, weight decay 1e-4).

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_convnext_golden.py tests/fixtures/convnext_golden
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import ConvNextConfig, ConvNextForImageClassification

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
STEPS = 5


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = ConvNextConfig(num_channels=3, patch_size=2, num_stages=3, hidden_sizes=[8, 16, 24],
                            depths=[1, 2, 1], hidden_act="gelu", layer_scale_init_value=0.5,
                            layer_norm_eps=1e-12, image_size=32, num_labels=10)
    model = ConvNextForImageClassification(config)
    with torch.no_grad():  # every weight away from its initial value
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.train()
    model.save_pretrained(out, safe_serialization=True)

    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([3, 0, 9, 3])
    save_file({"pixel_values": pixels.contiguous(),
               "pixel_values_nhwc": pixels.permute(0, 2, 3, 1).contiguous(),
               "labels": labels}, os.path.join(out, "batch.safetensors"))
    out_ = model(pixel_values=pixels, labels=labels)
    out_.loss.backward()
    expected = {"logits": out_.logits.detach(), "loss": out_.loss.detach()}
    for name, p in model.named_parameters():
        expected["grad." + name] = p.grad.detach().clone()
    opt = torch.optim.SGD(model.parameters(), **SGD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(pixel_values=pixels, labels=labels).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
    expected["sgd_losses"] = torch.tensor(losses, dtype=torch.float64)
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out, "expected.safetensors"),
              metadata={"sgd": str(SGD), "steps": str(STEPS), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__})
    print("loss", out_.loss.item(), "sgd losses", losses)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/convnext_golden")
