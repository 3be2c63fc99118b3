"""Golden fixture for random erasing: timm's RandomErasing (mode "const",
one box) on fixed draws. timm's module draws from Python's random module;
here it draws from a recorded list of uniform numbers instead (random() as
it is, uniform(a, b) = a + (b - a)·u, randint(a, b) = a + floor(u·(b - a + 1))),
which tests/data/mixup_test.cpp hands to kiln::data::erase_box alike.

    pip install --target DIR --no-deps timm torchvision pillow pyyaml huggingface_hub safetensors
    PYTHONPATH=DIR .venv/bin/python tools/golden/make_erasing_golden.py tests/fixtures/erasing.json
"""
import json
import math
import sys

import numpy as np
import timm
import timm.data.random_erasing as re
import torch


class Recorded:
    def __init__(self, draws):
        self.draws, self.used = list(draws), 0

    def random(self):
        self.used += 1
        return self.draws[self.used - 1]

    def uniform(self, a, b):
        return a + (b - a) * self.random()

    def randint(self, a, b):
        return a + math.floor(self.random() * (b - a + 1))


out = {"timm": timm.__version__, "shape": [3, 8, 9], "cases": []}
for seed in range(20):
    # The last cases' boxes are often too large: retries.
    opts = dict(probability=0.7) if seed < 12 else dict(probability=0.9, max_area=0.9,
                                                        min_aspect=0.2)
    rng = np.random.default_rng(seed)
    draws = rng.random(40).tolist()
    x = torch.tensor(rng.standard_normal((3, 8, 9)).astype(np.float32))
    re.random = Recorded(draws)
    erase = re.RandomErasing(**opts, mode="const", device="cpu")
    y = erase(x.clone())
    out["cases"].append({**opts, "draws": draws, "used": re.random.used, "image": x.flatten().tolist(),
                         "erased": y.flatten().tolist()})
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
    f.write("\n")
