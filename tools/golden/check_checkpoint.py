#!/usr/bin/env python3
"""Loads a `kiln train --save DIR` checkpoint with transformers'
ViTForImageClassification.from_pretrained(DIR) and prints its loss and top-1
accuracy on the Fashion-MNIST test split (normalized as kiln does), to compare
with `kiln eval --checkpoint DIR --data fashion-mnist`.

    tools/golden/.venv/bin/python tools/golden/check_checkpoint.py DIR
"""
import gzip
import sys

import numpy as np
import torch
from transformers import ViTForImageClassification

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main(ckpt):
    model = ViTForImageClassification.from_pretrained(ckpt, attn_implementation="eager").eval()
    x = read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    loss, hits = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), 500):
            logits = model(pixel_values=x[i:i + 500]).logits
            loss += torch.nn.functional.cross_entropy(logits, y[i:i + 500], reduction="sum").item()
            hits += (logits.argmax(-1) == y[i:i + 500]).sum().item()
    print(f"transformers {__import__('transformers').__version__}: {ckpt} on fashion-mnist test: "
          f"loss {loss / len(x):.4f}, accuracy {100 * hits / len(x):.2f}% ({len(x)} images)")


if __name__ == "__main__":
    main(sys.argv[1])
