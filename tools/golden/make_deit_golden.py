#!/usr/bin/env python3
"""Writes the golden DeiT fixtures that tests/nn/deit_golden_test.cpp checks
kiln against: a small transformers DeiTForImageClassification and the same
weights in DeiTForImageClassificationWithTeacher (its cls_classifier and
distillation_classifier), their config and weights, a batch, and what
PyTorch computes: logits, the loss (softmax cross-entropy of the logits,
which the teacher model does not compute itself) and every gradient.

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_deit_golden.py tests/fixtures/deit_golden
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (DeiTConfig, DeiTForImageClassification,
                          DeiTForImageClassificationWithTeacher)


def run(model, pixels, labels, out, name):
    model.train()
    model.save_pretrained(os.path.join(out, name), safe_serialization=True)
    logits = model(pixel_values=pixels).logits
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    expected = {"logits": logits.detach(), "loss": loss.detach()}
    for n, p in model.named_parameters():
        if p.grad is not None:
            expected["grad." + n] = p.grad.detach().clone()
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out, name, "expected.safetensors"),
              metadata={"torch": torch.__version__,
                        "transformers": __import__("transformers").__version__})
    print(name, "loss", loss.item())


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, hidden_act="gelu", hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, initializer_range=0.02,
                        layer_norm_eps=1e-12, image_size=32, patch_size=8, num_channels=3,
                        qkv_bias=True, num_labels=10)
    config._attn_implementation = "eager"
    model = DeiTForImageClassification(config)
    with torch.no_grad():  # every weight away from its initial value (tokens from zero)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([3, 0, 9, 3])
    save_file({"pixel_values": pixels.contiguous(),
               "pixel_values_nhwc": pixels.permute(0, 2, 3, 1).contiguous(),
               "labels": labels}, os.path.join(out, "batch.safetensors"))
    run(model, pixels, labels, out, "deit")

    teacher = DeiTForImageClassificationWithTeacher(config)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
    with torch.no_grad():
        for p in teacher.parameters():
            p.normal_(0, 0.1)
    missing, unexpected = teacher.load_state_dict(state, strict=False)
    assert not unexpected and all("classifier" in m for m in missing), (missing, unexpected)
    run(teacher, pixels, labels, out, "deit_with_teacher")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/deit_golden")
