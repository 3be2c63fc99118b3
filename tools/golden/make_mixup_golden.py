"""Golden fixture for mixup and cutmix: timm's Mixup (mode "batch") on fixed
draws. For each case numpy's generator is seeded, timm mixes a batch and
makes its soft targets; the same seed then gives the draws it used (lam,
cutmix or not, the box), which tests/data/mixup_test.cpp hands to
kiln::data::mix_batch to compare.

    pip install --target DIR --no-deps timm torchvision pillow pyyaml huggingface_hub safetensors
    PYTHONPATH=DIR .venv/bin/python tools/golden/make_mixup_golden.py tests/fixtures/mixup.json
"""
import json
import sys

import numpy as np
import timm
import torch
from timm.data.mixup import Mixup, cutmix_bbox_and_lam

CASES = [
    dict(mixup_alpha=0.8, cutmix_alpha=0.0, seed=0),
    dict(mixup_alpha=0.8, cutmix_alpha=0.0, seed=1),
    dict(mixup_alpha=0.0, cutmix_alpha=1.0, seed=2),
    dict(mixup_alpha=0.0, cutmix_alpha=1.0, seed=3),
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, seed=4),
    dict(mixup_alpha=0.8, cutmix_alpha=1.0, seed=11),
]
SMOOTHING, CLASSES = 0.1, 5

out = {"timm": timm.__version__, "label_smoothing": SMOOTHING, "num_classes": CLASSES, "cases": []}
for case in CASES:
    rng = np.random.default_rng(100 + case["seed"])
    x = torch.tensor(rng.standard_normal((4, 3, 6, 7)).astype(np.float32))
    y = torch.tensor([0, 3, 4, 3])
    mix = Mixup(mixup_alpha=case["mixup_alpha"], cutmix_alpha=case["cutmix_alpha"],
                label_smoothing=SMOOTHING, num_classes=CLASSES)
    np.random.seed(case["seed"])
    mixed, targets = mix(x.clone(), y)
    np.random.seed(case["seed"])
    lam, use_cutmix = mix._params_per_batch()
    box = [0, 0, 0, 0]
    if use_cutmix:
        (yl, yh, xl, xh), lam = cutmix_bbox_and_lam(x.shape, lam, correct_lam=True)
        box = [int(yl), int(yh), int(xl), int(xh)]
    out["cases"].append({**case, "lam": float(lam), "cutmix": bool(use_cutmix), "box": box,
                         "images": x.flatten().tolist(), "labels": y.tolist(),
                         "mixed": mixed.flatten().tolist(),
                         "targets": targets.flatten().tolist()})
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
    f.write("\n")
