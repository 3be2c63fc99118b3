#!/usr/bin/env python3
"""Writes the fixture that `kiln predict` with a ConvNextImageProcessor (the
processor of microsoft/resnet-* and facebook/convnext-*: the shorter side
resized to shortest_edge / crop_pct, then the centre shortest_edge square)
is checked against (tests/cli/predict_test.cpp): a small ResNet saved by
transformers with ConvNextImageProcessor(size={"shortest_edge": 24},
crop_pct=0.875, bicubic, ImageNet mean and std), and what transformers'
image-classification pipeline says with top_k=3:

- OUT/config.json, model.safetensors, preprocessor_config.json;
- OUT/expected.jsonl: every image of tests/fixtures/decode/images/;
- OUT/photos.jsonl: the photographs of tests/fixtures/predict/photos/;
- OUT/expected.safetensors: the processor's pixel_values of each photograph
  (`pixel_values.<file>`, F32 [3, 24, 24]).

    PYTHONPATH=<transformers 4.46.3> .venv/bin/python tools/golden/make_convnext_processor_golden.py \\
        tests/fixtures/predict/resnet
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import ConvNextImageProcessor, ResNetConfig, ResNetForImageClassification, pipeline
from transformers.image_utils import load_image

LABELS = ["tabby cat", "golden retriever", "tench", "goldfish", "espresso"]


def model():
    c = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                     id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    torch.manual_seed(0)
    m = ResNetForImageClassification(c)
    with torch.no_grad():  # running statistics and a classifier that make the scores far from uniform
        for name, b in m.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn_like(b) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand_like(b) + 0.5)
        m.classifier[1].weight.mul_(20)
    return m.eval()


def main(out):
    fixtures = os.path.dirname(os.path.dirname(os.path.abspath(out)))
    images = os.path.join(fixtures, "decode", "images")
    photo_dir = os.path.join(fixtures, "predict", "photos")
    files = sorted(os.listdir(images))
    photos = sorted(f for f in os.listdir(photo_dir) if f.endswith((".jpg", ".png")))
    shutil.rmtree(out, ignore_errors=True)
    model().save_pretrained(out)
    proc = ConvNextImageProcessor(size={"shortest_edge": 24}, crop_pct=0.875, resample=3,
                                  image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    proc.save_pretrained(out)
    pipe = pipeline("image-classification", model=out, image_processor=ConvNextImageProcessor.from_pretrained(out),
                    device="cpu")
    for name, folder, names in [("expected.jsonl", images, files), ("photos.jsonl", photo_dir, photos)]:
        with open(os.path.join(out, name), "w") as fh:
            for f in names:
                fh.write(json.dumps({"file": f, "predictions": pipe(os.path.join(folder, f), top_k=3)}) + "\n")
    save_file({f"pixel_values.{f}": np.ascontiguousarray(
                   proc(images=load_image(os.path.join(photo_dir, f)), return_tensors="np")["pixel_values"][0])
               for f in photos}, os.path.join(out, "expected.safetensors"),
              metadata={"transformers": transformers.__version__})
    print(len(files), "images,", len(photos), "photos; transformers", transformers.__version__, sorted(os.listdir(out)))


if __name__ == "__main__":
    main(sys.argv[1])
