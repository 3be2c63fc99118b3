#!/usr/bin/env python3
"""Writes tests/fixtures/color_jitter.json: torchvision's ColorJitter on
Pillow images with fixed draws (the order of the four adjustments and their
factors), for tests/data/color_jitter_test.cpp. torchvision.transforms.
functional_pil's adjustments are Pillow calls, made here as it makes them:
brightness, contrast and saturation by ImageEnhance (Brightness, Contrast,
Color), hue by shifting the H band of the image in HSV by
uint8(int8(hue_factor * 255)), wrapping.

    PYTHONPATH=<Pillow> python3 tools/golden/make_color_jitter_golden.py tests/fixtures/color_jitter.json
"""
import json
import random
import sys

import numpy as np
import PIL
from PIL import Image, ImageEnhance


def adjust(img, which, factor):
    if which == 0:
        return ImageEnhance.Brightness(img).enhance(factor)
    if which == 1:
        return ImageEnhance.Contrast(img).enhance(factor)
    if which == 2:
        return ImageEnhance.Color(img).enhance(factor)
    h, s, v = img.convert("HSV").split()
    np_h = np.array(h, dtype=np.uint8)
    with np.errstate(over="ignore"):
        np_h += np.array(np.int8(factor * 255)).astype(np.uint8)
    h = Image.fromarray(np_h, "L")
    return Image.merge("HSV", (h, s, v)).convert("RGB")


def main(out):
    rng = random.Random(0)
    cases = []
    for n in range(40):
        w, h = rng.randint(1, 12), rng.randint(1, 10)
        pixels = [rng.randrange(256) for _ in range(w * h * 3)]
        if n % 6 == 5:  # grey pixels: hue and saturation leave them
            pixels = [p for p in pixels[: w * h] for _ in range(3)]
        img = Image.frombytes("RGB", (w, h), bytes(pixels))
        order = list(range(4))
        rng.shuffle(order)
        factors = [rng.uniform(0.0, 2.0), rng.uniform(0.0, 2.0), rng.uniform(0.0, 2.0),
                   rng.uniform(-0.5, 0.5)]
        if n % 4 == 3:
            factors[rng.randrange(3)] = 1.0  # Pillow's blend copies at exactly 1
        if n % 8 == 7:
            factors[0] = 0.0
        result = img
        for which in order:
            result = adjust(result, which, factors[which])
        cases.append({"width": w, "height": h, "pixels": pixels, "order": order,
                      "brightness": factors[0], "contrast": factors[1], "saturation": factors[2],
                      "hue": factors[3], "expected": list(result.tobytes())})
    with open(out, "w") as f:
        json.dump({"pillow": PIL.__version__, "cases": cases}, f)
        f.write("\n")
    print(len(cases), "cases, Pillow", PIL.__version__)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/color_jitter.json")
