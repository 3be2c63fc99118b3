#!/usr/bin/env python3
"""Writes the fixtures that `kiln predict` is checked against
(tests/cli/predict_test.cpp): small ViTs saved by transformers with a
ViTImageProcessor (bicubic, ImageNet mean and std), and what transformers'
image-classification pipeline (Pillow backend) says of every image of
tests/fixtures/decode/images/ with top_k=3, one JSON line per image as
`kiln predict --json` prints them:

- OUT/single/: 5 labels, single-label classification (softmax);
- OUT/multi/: the same weights, problem_type multi_label_classification (sigmoid);
- OUT/<name>/expected.jsonl;
- OUT/photos/: a handful of real photographs that scikit-image ships
  (rocket.jpg: SpaceX, public domain; chelsea.png: CC0 by Stefan van der
  Walt; coffee.png: CC0 by Rachel Michetti, as a JPEG stored sideways with
  EXIF orientation 6), with the pipeline's predictions for both models
  (`<name>.jsonl`) and the processor's pixel_values of each
  (expected.safetensors: `pixel_values.<file>`, F32 [3, 24, 24]).

    bench/peers/.venv-gpu-machine/bin/python tools/golden/make_predict_golden.py tests/fixtures/predict
"""
import json
import os
import shutil
import sys

import numpy as np
import skimage
from PIL import Image
from safetensors.numpy import save_file
from transformers.image_utils import load_image

import torch
import transformers
from transformers import ViTConfig, ViTForImageClassification, pipeline
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

LABELS = ["tabby cat", "golden retriever", "tench", "goldfish", "espresso"]


def model(problem_type):
    c = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, image_size=24, patch_size=6,
                  num_channels=3, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)},
                  problem_type=problem_type)
    torch.manual_seed(0)
    m = ViTForImageClassification(c)
    with torch.no_grad():  # larger weights than the init gives: scores far from uniform
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def photos(folder):
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(os.path.dirname(skimage.__file__), "data")
    for name in ("rocket.jpg", "chelsea.png"):
        shutil.copyfile(os.path.join(data, name), os.path.join(folder, name))
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(os.path.join(data, "coffee.png")).convert("RGB").transpose(Image.Transpose.ROTATE_90).save(
        os.path.join(folder, "coffee_exif6.jpg"), "JPEG", quality=85, exif=exif)
    return sorted(f for f in os.listdir(folder) if f.endswith((".jpg", ".png")))


def main(out):
    images = os.path.join(os.path.dirname(os.path.abspath(out)), "decode", "images")
    files = sorted(os.listdir(images))
    photo_dir = os.path.join(out, "photos")
    shutil.rmtree(photo_dir, ignore_errors=True)
    photo_files = photos(photo_dir)
    proc = ViTImageProcessorPil(size={"height": 24, "width": 24}, resample=3,
                                image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    for name, problem in [("single", "single_label_classification"), ("multi", "multi_label_classification")]:
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        model(problem).save_pretrained(d)
        proc.save_pretrained(d)
        pipe = pipeline("image-classification", model=d, image_processor=ViTImageProcessorPil.from_pretrained(d),
                        device="cpu")
        lines = []
        for f in files:
            preds = pipe(os.path.join(images, f), top_k=3)
            lines.append(json.dumps({"file": f, "predictions": preds}))
        with open(os.path.join(d, "expected.jsonl"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        with open(os.path.join(photo_dir, name + ".jsonl"), "w") as fh:
            for f in photo_files:
                fh.write(json.dumps({"file": f, "predictions": pipe(os.path.join(photo_dir, f), top_k=3)}) + "\n")
        print(name, len(lines), "images;", sorted(os.listdir(d)))
    save_file({f"pixel_values.{f}": np.ascontiguousarray(
                   proc(images=load_image(os.path.join(photo_dir, f)), return_tensors="np")["pixel_values"][0])
               for f in photo_files}, os.path.join(photo_dir, "expected.safetensors"),
              metadata={"transformers": transformers.__version__})
    print("photos:", photo_files, "transformers", transformers.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
