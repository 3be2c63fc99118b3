#!/usr/bin/env python3
"""Writes the pretrained-model fixtures that tests/io/pretrained_test.cpp
loads: small ViTs saved by transformers' save_pretrained, as a user's folder
or the Hub holds them, each with what transformers computes from it
(expected.safetensors: pixel_values, and logits, or for a headless ViTModel
the final [CLS] features last_hidden_state[:, 0]), computed in f32 from the
weights as saved (f16 and bf16 saves are loaded back as f32).

Run it once with transformers 4.x and once with 5.x; each writes its own:

    tools/golden/.venv/bin/python tools/golden/make_pretrained_golden.py tests/fixtures/pretrained
        (4.x: v4-classifier, v4-headless, v4-f16)
    bench/peers/.venv-gpu-machine/bin/python tools/golden/make_pretrained_golden.py tests/fixtures/pretrained
        (5.x: v5-classifier, v5-headless, v5-sharded, v5-bf16)
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


if __name__ == "__main__":
    main(sys.argv[1])
