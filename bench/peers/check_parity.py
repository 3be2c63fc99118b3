#!/usr/bin/env python3
"""Checks that the PyTorch and JAX peers compute the same loss and logits from
the same weights and batch: a small transformers ViT in PyTorch, its weights
loaded into FlaxViTForImageClassification (from_pt), one batch."""
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax.numpy as jnp
import numpy as np
import optax
import torch
from transformers import FlaxViTForImageClassification, ViTConfig, ViTForImageClassification


def main():
    torch.manual_seed(0)
    config = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, num_labels=10, layer_norm_eps=1e-12)
    config._attn_implementation = "eager"
    pt = ViTForImageClassification(config).eval()
    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([1, 5, 9, 0])
    with torch.no_grad():
        out = pt(pixel_values=pixels, labels=labels)
    with tempfile.TemporaryDirectory() as d:
        pt.save_pretrained(d, safe_serialization=False)
        fx = FlaxViTForImageClassification.from_pretrained(d, from_pt=True)
    # NHWC into the Flax module, as bench/peers/jax_vit.py feeds it.
    nhwc = jnp.asarray(pixels.permute(0, 2, 3, 1).numpy())
    logits = fx.module.apply({"params": fx.params}, nhwc, deterministic=True).logits
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(labels.numpy())).mean()
    dl = float(np.abs(np.asarray(logits) - out.logits.numpy()).max())
    print(f"pytorch loss {out.loss.item():.7f}, jax loss {float(loss):.7f}, max |logits diff| {dl:.2e}")
    if abs(out.loss.item() - float(loss)) > 1e-5 or dl > 1e-4:
        print("MISMATCH", file=sys.stderr)
        sys.exit(1)
    print("peers agree")


if __name__ == "__main__":
    main()
