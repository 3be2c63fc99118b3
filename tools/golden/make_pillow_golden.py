#!/usr/bin/env python3
"""Writes the Pillow fixture that tests/data/resize_test.cpp checks kiln's
resampling against, bit for bit: 8-bit images (grey and RGB; noise, and
smooth gradients) resized by Pillow's Image.resize with every resample
filter (NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING), up and down,
to odd sizes, each axis either way. One safetensors file: the sources `source.n`
(I32 [height, width, channels]), and for case i the result `out.i` (I32
[height, width, channels]) and `case.i` (I32: source n, resample, width,
height).

    bench/peers/.venv-gpu-machine/bin/python tools/golden/make_pillow_golden.py tests/fixtures/pillow_resize.safetensors
"""
import sys

import numpy as np
import PIL
from PIL import Image
from safetensors.numpy import save_file

SOURCES = [  # (width, height, mode, kind)
    (17, 13, "RGB", "noise"),
    (9, 31, "L", "noise"),
    (32, 24, "RGB", "gradient"),
    (5, 5, "L", "gradient"),
]
TARGETS = [(23, 19), (5, 7), (3, 50), (40, 11), (1, 1)]


def source(w, h, mode, kind, rng):
    c = 3 if mode == "RGB" else 1
    if kind == "noise":
        a = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
    else:
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack([(x * 255 // max(w - 1, 1) + k * 40 + y * 3) % 256 for k in range(c)], -1).astype(np.uint8)
    return a


def main(out):
    rng = np.random.default_rng(0)
    tensors = {}
    i = 0
    for n, (w, h, mode, kind) in enumerate(SOURCES):
        a = source(w, h, mode, kind, rng)
        img = Image.fromarray(np.ascontiguousarray(a[:, :, 0]) if mode == "L" else a, mode)
        tensors[f"source.{n}"] = a.astype(np.int32)
        for tw, th in TARGETS + [(w, h)]:
            for resample in range(6):
                r = np.asarray(img.resize((tw, th), resample=resample))
                if r.ndim == 2:
                    r = r[:, :, None]
                tensors[f"out.{i}"] = np.ascontiguousarray(r.astype(np.int32))
                tensors[f"case.{i}"] = np.array([n, resample, tw, th], dtype=np.int32)
                i += 1
    save_file(tensors, out, metadata={"pillow": PIL.__version__})
    print(f"{i} cases, Pillow {PIL.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
