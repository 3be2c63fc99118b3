#!/usr/bin/env python3
"""Writes the golden ViT fixture that tests/nn/vit_golden_test.cpp checks kiln
against, in the manner of llm.c's test_gpt2: a small transformers
ViTForImageClassification, its config and weights, a batch, and what
PyTorch computes from them: logits, loss, every gradient, and the losses of 5
SGD steps (momentum 0.9, weight decay 1e-4).

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_vit_golden.py tests/fixtures/vit_golden
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import ViTConfig, ViTForImageClassification

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
STEPS = 5


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.02, layer_norm_eps=1e-12, image_size=32, patch_size=8,
        num_channels=3, qkv_bias=True, num_labels=10)
    config._attn_implementation = "eager"
    model = ViTForImageClassification(config)
    # Larger weights than the init gives, so that every path carries signal.
    with torch.no_grad():
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
              metadata={"sgd": str(SGD), "steps": str(STEPS),
                        "torch": torch.__version__, "transformers": __import__("transformers").__version__})
    print("loss", out_.loss.item(), "sgd losses", losses)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/vit_golden")
