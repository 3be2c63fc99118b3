#!/usr/bin/env python3
"""Writes the pretrained-model fixtures that tests/io/pretrained_test.cpp
loads: small ViTs saved by transformers' save_pretrained, as a user's folder
or the Hub holds them, each with what transformers computes from it
(expected.safetensors: pixel_values, and logits, or for a headless ViTModel
the final [CLS] features last_hidden_state[:, 0]), computed in f32 from the
weights as saved (f16 and bf16 saves are loaded back as f32); and for the
classifier saves, resampled.safetensors: the position embeddings and logits
at other resolutions (interpolate_pos_encoding).

Run it once with transformers 4.x and once with 5.x; each writes its own:

    tools/golden/.venv/bin/python tools/golden/make_pretrained_golden.py tests/fixtures/pretrained
        (4.x: v4-classifier, v4-headless, v4-f16)
    bench/peers/.venv-gpu-machine/bin/python tools/golden/make_pretrained_golden.py tests/fixtures/pretrained
        (5.x: v5-classifier, v5-headless, v5-sharded, v5-bf16, v5-state-dict)
"""
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import ViTConfig, ViTForImageClassification, ViTModel


def config():
    c = ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                  hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  initializer_range=0.02, layer_norm_eps=1e-12, image_size=16, patch_size=4,
                  num_channels=3, qkv_bias=True,
                  id2label={0: "cat", 1: "dog", 2: "tench"}, label2id={"cat": 0, "dog": 1, "tench": 2})
    c._attn_implementation = "eager"
    return c


def signal(model):
    """Larger weights than the init gives, so that every path carries signal."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def save(model, out, name, pixels, **kwargs):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True, **kwargs)
    # What transformers computes from the folder as saved, in f32.
    cls = type(model)
    loaded = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        if cls is ViTModel:
            out_t = {"features": loaded(pixel_values=pixels).last_hidden_state[:, 0].contiguous()}
        else:
            out_t = {"logits": loaded(pixel_values=pixels).logits.contiguous()}
    save_file({"pixel_values": pixels, **out_t}, os.path.join(d, "expected.safetensors"))
    print(name, sorted(os.listdir(d)))


def state_dict(model, out, name, pixels):
    """A model's state_dict as it is in memory (transformers 5 renames the
    encoder's modules there: vit.layers.N.attention.q_proj ...), saved by
    safetensors itself, beside save_pretrained's config.json."""
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model.config.save_pretrained(d)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(d, "model.safetensors"))
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits.contiguous()
    save_file({"pixel_values": pixels, "logits": logits}, os.path.join(d, "expected.safetensors"))
    print(name, sorted(model.state_dict())[-4:])


# New resolutions (height, width) for the classifier saves: what transformers'
# interpolate_pos_encoding (torch's bicubic, align_corners=False) makes of the
# 4x4 grid of position embeddings, and the logits at that size.
RESOLUTIONS = [(24, 24), (12, 20), (8, 8), (28, 16)]


def resampled(out, name):
    d = os.path.join(out, name)
    model = ViTForImageClassification.from_pretrained(d, torch_dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    tensors = {}
    with torch.no_grad():
        for h, w in RESOLUTIONS:
            n = (h // 4) * (w // 4)
            key = f"{h}x{w}"
            tensors[f"position_embeddings_{key}"] = model.vit.embeddings.interpolate_pos_encoding(
                torch.zeros(1, 1 + n, 16), h, w).contiguous()
            pixels = torch.randn(2, 3, h, w)
            tensors[f"pixel_values_{key}"] = pixels
            tensors[f"logits_{key}"] = model(pixel_values=pixels, interpolate_pos_encoding=True).logits.contiguous()
    save_file(tensors, os.path.join(d, "resampled.safetensors"))
    print(name, "resampled.safetensors")


def main(out):
    major = int(transformers.__version__.split(".")[0])
    torch.manual_seed(major)
    pixels = torch.randn(2, 3, 16, 16)
    tag = f"v{major}"
    save(signal(ViTForImageClassification(config())), out, f"{tag}-classifier", pixels)
    save(signal(ViTModel(config())), out, f"{tag}-headless", pixels)
    if major == 4:
        save(signal(ViTForImageClassification(config())).half(), out, f"{tag}-f16", pixels)
    else:
        save(signal(ViTForImageClassification(config())), out, f"{tag}-sharded", pixels,
             max_shard_size="8KB")
        save(signal(ViTForImageClassification(config())).to(torch.bfloat16), out, f"{tag}-bf16",
             pixels)
    if major >= 5:
        state_dict(signal(ViTForImageClassification(config())), out, f"{tag}-state-dict", pixels)
    resampled(out, f"{tag}-classifier")


if __name__ == "__main__":
    main(sys.argv[1])
