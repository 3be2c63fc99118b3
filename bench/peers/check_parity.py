#!/usr/bin/env python3
"""Checks that the PyTorch and JAX peers compute the same loss and logits from
the same weights and batch: a small transformers ViT in PyTorch, its weights
loaded into the flax.linen ViT of flax_vit.py (which jax_vit.py trains), one
batch (NCHW for PyTorch, the same pixels NHWC for JAX)."""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax.numpy as jnp
import numpy as np
import optax
import torch
from transformers import ViTConfig, ViTForImageClassification

import flax_vit


def main():
    torch.manual_seed(0)
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    config = ViTConfig(**kw, image_size=32, patch_size=8, num_labels=10, layer_norm_eps=1e-12)
    config._attn_implementation = "eager"
    pt = ViTForImageClassification(config).eval()
    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([1, 5, 9, 0])
    with torch.no_grad():
        out = pt(pixel_values=pixels, labels=labels)
    model = flax_vit.ViTForImageClassification(**kw, num_labels=10, patch_size=8)
    params = flax_vit.from_torch_state_dict(pt.state_dict(), kw["num_hidden_layers"])
    logits = model.apply({"params": params}, jnp.asarray(pixels.permute(0, 2, 3, 1).numpy()))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(labels.numpy())).mean()
    dl = float(np.abs(np.asarray(logits) - out.logits.numpy()).max())
    print(f"pytorch loss {out.loss.item():.7f}, jax loss {float(loss):.7f}, max |logits diff| {dl:.2e}")
    if abs(out.loss.item() - float(loss)) > 1e-5 or dl > 1e-4:
        print("MISMATCH", file=sys.stderr)
        sys.exit(1)
    print("peers agree")


if __name__ == "__main__":
    main()
