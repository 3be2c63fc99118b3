#!/usr/bin/env python3
"""Writes the golden fixtures for the ViT configurations beyond the default
one (tests/nn/vit_configs_golden_test.cpp checks kiln against them): each case
is a tiny transformers ViTForImageClassification saved with save_pretrained
(config.json, model.safetensors) and golden.safetensors with a batch and what
PyTorch computes from it in training mode: logits, loss, every gradient, and
for some cases the losses of 5 SGD steps (momentum 0.9, weight decay 1e-4).

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_vit_configs_golden.py tests/fixtures/vit_configs

Cases:
  nonsquare       image_size [18, 13], patch_size [5, 4]: 3 x 3 patches, the
                  last 3 rows and 1 column never reach the convolution;
                  also labels with -100 (CrossEntropyLoss's ignore_index)
  activations     one model run with every hidden_act in ACT2FN (the
                  intermediate layer's weights scaled so that its inputs
                  reach the clips of gelu_10 and relu6)
  regression      num_labels 1, problem_type unset: MSELoss on squeezed logits
  regression_multi  problem_type "regression", num_labels 3: MSELoss
  multi_label     problem_type "multi_label_classification": BCEWithLogitsLoss;
                  12 x 8 grey images (num_channels 1)
  pruned          pruned_heads {"0": [1], "1": [0, 2]}, qkv_bias false
  no_classifier   num_labels 0: nn.Identity head, BCEWithLogitsLoss on the
                  [CLS] features against float labels; num_channels 2
"""
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import ViTConfig, ViTForImageClassification
from transformers.activations import ACT2CLS

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
STEPS = 5
BATCH = 3
SMALL = dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, image_size=8,
             patch_size=4, num_channels=3)


def build(**kwargs):
    config = ViTConfig(**{**SMALL, **kwargs})
    config._attn_implementation = "eager"
    model = ViTForImageClassification(config)
    # Larger weights than the init gives, so that every path carries signal.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.train()
    return model


def pixels_for(config):
    h, w = (config.image_size if isinstance(config.image_size, (list, tuple))
            else (config.image_size,) * 2)
    return torch.randn(BATCH, config.num_channels, h, w)


def forward_backward(model, pixels, labels, prefix=""):
    model.zero_grad()
    out = model(pixel_values=pixels, labels=labels)
    out.loss.backward()
    result = {prefix + "logits": out.logits.detach().clone(), prefix + "loss": out.loss.detach()}
    for name, p in model.named_parameters():
        result[prefix + "grad." + name] = p.grad.detach().clone()
    return result


def sgd_losses(model, pixels, labels):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), **SGD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(pixel_values=pixels, labels=labels).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
    model.load_state_dict(state)
    return torch.tensor(losses, dtype=torch.float64)


def save(out, name, model, tensors):
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "golden.safetensors"),
              metadata={"sgd": str(SGD), "steps": str(STEPS), "torch": torch.__version__,
                        "transformers": transformers.__version__})
    print(name, {k: round(v.item(), 6) for k, v in tensors.items() if k.endswith("loss")})


def nonsquare(out):
    model = build(image_size=[18, 13], patch_size=[5, 4], num_labels=5, hidden_act="gelu")
    pixels = pixels_for(model.config)
    labels = torch.tensor([3, 0, 4])
    ignore = torch.tensor([2, -100, 4])
    t = {"pixel_values": pixels, "labels": labels, "labels_ignore": ignore}
    t.update(forward_backward(model, pixels, labels))
    t.update(forward_backward(model, pixels, ignore, prefix="ignore."))
    t["sgd_losses"] = sgd_losses(model, pixels, labels)
    save(out, "nonsquare", model, t)


def activations(out):
    model = build(num_hidden_layers=1, num_labels=3, hidden_act="gelu")
    with torch.no_grad():  # pre-activations of std ~6: both tails of every activation
        model.vit.encoder.layer[0].intermediate.dense.weight.mul_(20.0)
    pixels = pixels_for(model.config)
    labels = torch.tensor([2, 0, 1])
    t = {"pixel_values": pixels, "labels": labels}
    layer = model.vit.encoder.layer[0]
    with torch.no_grad():
        hidden = model.vit.embeddings(pixels)
        pre = layer.intermediate.dense(layer.layernorm_after(
            hidden + layer.attention(layer.layernorm_before(hidden))[0]))
    print("activations: intermediate inputs in [%.1f, %.1f], std %.1f"
          % (pre.min(), pre.max(), pre.std()))
    for act in ACT2CLS:
        layer.intermediate.intermediate_act_fn = transformers.activations.ACT2FN[act]
        t.update(forward_backward(model, pixels, labels, prefix=act + "."))
    layer.intermediate.intermediate_act_fn = transformers.activations.ACT2FN["gelu"]
    save(out, "activations", model, t)


def regression(out):
    model = build(num_labels=1, hidden_act="quick_gelu", qkv_bias=False, layer_norm_eps=1e-6)
    pixels = pixels_for(model.config)
    labels = torch.randn(BATCH)
    t = {"pixel_values": pixels, "labels": labels}
    t.update(forward_backward(model, pixels, labels))
    t["sgd_losses"] = sgd_losses(model, pixels, labels)
    model.config.problem_type = None  # forward() set it; the fixture leaves it unset
    save(out, "regression", model, t)


def regression_multi(out):
    model = build(num_labels=3, problem_type="regression", hidden_act="tanh")
    pixels = pixels_for(model.config)
    labels = torch.randn(BATCH, 3)
    t = {"pixel_values": pixels, "labels": labels}
    t.update(forward_backward(model, pixels, labels))
    save(out, "regression_multi", model, t)


def multi_label(out):
    model = build(num_labels=4, problem_type="multi_label_classification", hidden_act="relu",
                  image_size=[12, 8], patch_size=4, num_channels=1)
    pixels = pixels_for(model.config)
    labels = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 0]], dtype=torch.float32)
    t = {"pixel_values": pixels, "labels": labels}
    t.update(forward_backward(model, pixels, labels))
    t["sgd_losses"] = sgd_losses(model, pixels, labels)
    save(out, "multi_label", model, t)


def pruned(out):
    model = build(hidden_size=16, num_attention_heads=4, num_labels=3, hidden_act="silu",
                  qkv_bias=False, pruned_heads={0: [1], 1: [0, 2]})
    pixels = pixels_for(model.config)
    labels = torch.tensor([1, 2, 0])
    t = {"pixel_values": pixels, "labels": labels}
    t.update(forward_backward(model, pixels, labels))
    save(out, "pruned", model, t)


def no_classifier(out):
    model = build(num_labels=0, hidden_act="gelu_new", num_channels=2)
    pixels = pixels_for(model.config)
    labels = torch.rand(BATCH, model.config.hidden_size)
    t = {"pixel_values": pixels, "labels": labels}
    t.update(forward_backward(model, pixels, labels))
    model.config.problem_type = None
    save(out, "no_classifier", model, t)


def main(out):
    for i, case in enumerate([nonsquare, activations, regression, regression_multi, multi_label,
                              pruned, no_classifier]):
        torch.manual_seed(i)
        case(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/vit_configs")
