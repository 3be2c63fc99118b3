#!/usr/bin/env python3
"""Writes tests/fixtures/rand_augment.json for tests/data/rand_augment_test.cpp:
timm's RandAugment (timm/data/auto_augment.py) on Pillow images.

- "ops": each of RandAugment's 15 operations through timm's own op function
  (NAME_TO_OP) with a fixed argument, fill colour and resampling filter, on
  small random RGB images and on a smooth one;
- "levels": timm's magnitude-to-argument mappings (LEVEL_TO_ARG) of both
  transform sets (rand-... and rand-...-inc1), with the random negation
  forced either way;
- "configs": rand_augment_transform's reading of config strings (magnitude,
  layers, probability, magnitude noise and bound, which transform set).

timm is loaded from its auto_augment.py file alone (it needs Pillow and
NumPy, not torch):

    pip install --target T --no-deps timm; pip install --target P Pillow numpy
    PYTHONPATH=P python3 tools/golden/make_rand_augment_golden.py T/timm/data/auto_augment.py \
        tests/fixtures/rand_augment.json
"""
import importlib.util
import json
import math
import random
import sys

import PIL
from PIL import Image

RAND_OPS = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
            "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
            "TranslateXRel", "TranslateYRel"]
INCREASING = {"Posterize": "PosterizeIncreasing", "Solarize": "SolarizeIncreasing",
              "Color": "ColorIncreasing", "Contrast": "ContrastIncreasing",
              "Brightness": "BrightnessIncreasing", "Sharpness": "SharpnessIncreasing"}
RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def load_timm(path):
    spec = importlib.util.spec_from_file_location("timm_auto_augment", path)
    aa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa)
    return aa


def timm_version(path):
    """timm's version, from the version.py beside data/auto_augment.py."""
    text = open(path.rsplit("/data/", 1)[0] + "/version.py").read()
    return text.split("'")[1]


def image(rng, n, op):
    if op in ("AutoContrast", "Equalize") and n % 3 == 0:
        # 256 pixels or more: equalize's step (the pixels / 255) is nonzero
        w, h = rng.randint(16, 40), rng.randint(16, 30)
        px = [rng.randrange(256) if n % 2 else 60 + rng.randrange(100) for _ in range(w * h * 3)]
        return w, h, px
    if n % 7 == 6:  # a smooth image: the geometric ops move structure
        w, h = rng.randint(12, 24), rng.randint(10, 20)
        px = []
        for y in range(h):
            for x in range(w):
                px += [(x * 255) // max(1, w - 1), (y * 255) // max(1, h - 1),
                       ((x + y) * 97) % 256]
        return w, h, px
    w, h = rng.randint(1, 12), rng.randint(1, 10)
    px = [rng.randrange(256) for _ in range(w * h * 3)]
    if n % 5 == 4:  # few distinct values: the histogram ops' special cases
        px = [v // 64 * 64 for v in px]
    if n % 11 == 10:
        px = [px[0]] * len(px)
    return w, h, px


def argument(rng, op, n):
    if op in ("AutoContrast", "Equalize", "Invert"):
        return None
    if op == "Rotate":
        return [0.0, 30.0, -30.0, 17.25][n % 4] if n % 3 == 0 else rng.uniform(-30, 30)
    if op == "Posterize":
        return [1, 2, 3, 4, 8][n % 5]
    if op == "Solarize":
        return [0, 128, 256, rng.randint(0, 256)][n % 4]
    if op == "SolarizeAdd":
        return rng.randint(0, 110)
    if op in ("Color", "Contrast", "Brightness", "Sharpness"):
        return [1.0, 0.1, 1.9, rng.uniform(0.1, 1.9)][n % 4]
    if op in ("ShearX", "ShearY"):
        return rng.uniform(-0.3, 0.3)
    return rng.uniform(-0.45, 0.45)  # TranslateXRel, TranslateYRel


def main(timm_path, out):
    aa = load_timm(timm_path)
    rng = random.Random(0)
    ops = []
    for op in RAND_OPS:
        for n in range(12):
            w, h, px = image(rng, n, op)
            arg = argument(rng, op, n)
            fill = [rng.randrange(256) for _ in range(3)] if n % 2 else [128, 128, 128]
            resample = "bicubic" if n % 3 != 1 else "bilinear"
            img = Image.frombytes("RGB", (w, h), bytes(px))
            args = () if arg is None else (arg,)
            result = aa.NAME_TO_OP[op](img, *args, fillcolor=tuple(fill),
                                       resample=RESAMPLE[resample])
            ops.append({"op": op, "arg": arg, "fill": fill, "resample": resample, "width": w,
                        "height": h, "pixels": px, "expected": list(result.tobytes())})
    levels = []
    real_negate = aa._randomly_negate
    for increasing in (False, True):
        for op in RAND_OPS:
            name = INCREASING.get(op, op) if increasing else op
            level_fn = aa.LEVEL_TO_ARG[name]
            if level_fn is None:
                continue
            for magnitude in (0.0, 2.4, 2.5, 5.0, 9.0, 9.7, 10.0):
                for negate in (False, True):
                    aa._randomly_negate = (lambda v: -v) if negate else (lambda v: v)
                    (arg,) = level_fn(magnitude, {"translate_const": 100})
                    levels.append({"op": op, "increasing": increasing, "magnitude": magnitude,
                                   "negate": negate, "arg": arg})
    aa._randomly_negate = real_negate
    configs = []
    for text in ("rand-m9-mstd0.5", "rand-m9-mstd0.5-inc1", "rand-m7-n3", "rand-n1-p1.0",
                 "rand-m15-mmax20-mstd101", "rand", "rand-p0.25-m5-mstd0"):
        t = aa.rand_augment_transform(text, {})
        op = t.ops[0]
        std = op.magnitude_std
        configs.append({"config": text, "magnitude": op.magnitude, "num_layers": t.num_layers,
                        "prob": op.prob, "magnitude_std": -1 if math.isinf(std) else std,
                        "magnitude_max": op.magnitude_max or 10,
                        "increasing": t.ops[4].name == "PosterizeIncreasing"})
    with open(out, "w") as f:
        json.dump({"pillow": PIL.__version__, "timm": timm_version(timm_path),
                   "ops": ops, "levels": levels, "configs": configs}, f)
        f.write("\n")
    print(len(ops), "op cases,", len(levels), "levels,", len(configs), "configs; Pillow",
          PIL.__version__)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/rand_augment.json")
