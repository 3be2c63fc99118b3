#!/usr/bin/env python3
"""kiln predict beside transformers' image-classification pipeline, on the
same real photographs, model and CPU, in one run: images per second (batch
32, each peer timed end to end from a fresh process, model loading
included, --repeats times, alternating; and the pipeline's calls alone) and
how far kiln's scores are from the pipeline's; in fp32, and in bf16 beside
the pipeline with dtype=torch.bfloat16 (--precision fp32 bf16).

The photographs are the sample photos that scikit-learn and scikit-image
ship (china.jpg, flower.jpg, astronaut.png, chelsea.png, coffee.png,
rocket.jpg, ...; grey ones included), each also saved as a JPEG with an EXIF
rotation, repeated to --images files. The model is a ViT that transformers
saves (a kiln preset's architecture, ViTImageProcessor's defaults), or
(--model resnet-50) microsoft/resnet-50's architecture with its
ConvNextImageProcessor, with weights drawn so that its predictions are not
uniform.

    bench/peers/.venv-gpu-machine/bin/python bench/predict/compare.py --model vit-base --images 128 \\
        --precision fp32 bf16 --out bench/results/2026-12-02-predict
"""
import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import PIL
import sklearn.datasets
import skimage
import torch
import transformers
from PIL import Image
from transformers import ResNetConfig, ResNetForImageClassification, ViTConfig, ViTForImageClassification

# The Pillow-backed processors: transformers 5's *Pil classes, 4's slow ones.
PROCESSORS = r"""
def pil_processor(kind):
    try:
        if kind == "vit":
            from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil as P
        else:
            from transformers.models.convnext.image_processing_pil_convnext import ConvNextImageProcessorPil as P
    except ImportError:
        from transformers import ConvNextImageProcessor, ViTImageProcessor
        P = ViTImageProcessor if kind == "vit" else ConvNextImageProcessor
    return P
"""
exec(PROCESSORS)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import benchutil  # noqa: E402
import common  # noqa: E402

SKIMAGE_PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg",
                  "retina.jpg", "motorcycle_left.png", "camera.png", "coins.png", "moon.png", "brick.png",
                  "grass.png", "gravel.png", "immunohistochemistry.png"]


def photos(folder, count):
    """Real photographs as files, rotated EXIF copies too, repeated to `count`."""
    os.makedirs(folder, exist_ok=True)
    sources = []
    sk = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    for name in sorted(os.listdir(sk)):
        if name.endswith(".jpg"):
            sources.append(os.path.join(sk, name))
    data = os.path.join(os.path.dirname(skimage.__file__), "data")
    for name in SKIMAGE_PHOTOS:
        if os.path.exists(os.path.join(data, name)):
            sources.append(os.path.join(data, name))
    base = []
    for src in sources:
        dst = os.path.join(folder, os.path.basename(src))
        shutil.copyfile(src, dst)
        base.append(dst)
        # The same photo as a camera writes it: a JPEG stored sideways, with the EXIF orientation.
        img = Image.open(src).convert("RGB").transpose(Image.Transpose.ROTATE_90)
        exif = Image.Exif()
        exif[0x0112] = 6
        rot = os.path.join(folder, "exif6_" + os.path.splitext(os.path.basename(src))[0] + ".jpg")
        img.save(rot, "JPEG", quality=90, exif=exif)
        base.append(rot)
    files = []
    for i in range(count):
        src = base[i % len(base)]
        if i < len(base):
            files.append(src)
        else:
            dst = os.path.join(folder, f"copy{i:04d}_" + os.path.basename(src))
            shutil.copyfile(src, dst)
            files.append(dst)
    return sorted(files), len(base)


def save_model(folder, preset):
    """A model of the preset's architecture as transformers saves it: a ViT with
    ViTImageProcessor's defaults, or microsoft/resnet-50's architecture with its
    processor (ConvNextImageProcessor: shortest edge 224, crop_pct 0.875,
    bicubic, ImageNet mean and std)."""
    labels = {i: f"class {i}" for i in range(1000)}
    torch.manual_seed(0)
    if preset == "resnet-50":
        model = ResNetForImageClassification(ResNetConfig(
            num_labels=1000, id2label=labels, label2id={v: k for k, v in labels.items()})).eval()
        # (transformers' init already separates: ResNet-50's pooled features are large)
        model.save_pretrained(folder)
        pil_processor("convnext")(size={"shortest_edge": 224}, crop_pct=0.875, resample=3,
                                  image_mean=[0.485, 0.456, 0.406],
                                  image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
        return "convnext"
    kw = common.vit_config_kwargs(preset)
    kw["id2label"] = labels
    kw["label2id"] = {v: k for k, v in kw["id2label"].items()}
    model = ViTForImageClassification(ViTConfig(**kw)).eval()
    with torch.no_grad():  # a classifier that separates: predictions far from uniform
        model.classifier.weight.mul_(40)
    model.save_pretrained(folder)
    pil_processor("vit")().save_pretrained(folder)
    return "vit"


PIPELINE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from transformers import pipeline
""" + PROCESSORS + r"""
model, batch, out, dtype, kind, files = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
pipe = pipeline("image-classification", model=model, image_processor=pil_processor(kind).from_pretrained(model),
                device="cpu", torch_dtype=getattr(torch, dtype))
t1 = time.perf_counter()
preds = pipe(files, batch_size=batch, top_k=5)
t2 = time.perf_counter()
with open(out, "w") as f:
    for file, p in zip(files, preds):
        f.write(json.dumps({"file": file, "predictions": p}) + "\n")
print(json.dumps({"load_s": t1 - t0, "predict_s": t2 - t1, "threads": torch.get_num_threads()}))
"""


def run_pipeline(model, files, batch, out, precision, kind):
    t0 = time.perf_counter()
    dtype = "bfloat16" if precision == "bf16" else "float32"
    r = subprocess.run([sys.executable, "-c", PIPELINE, model, str(batch), out, dtype, kind] + files, check=True,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    info = json.loads(r.stdout.strip().splitlines()[-1])
    info["wall_s"] = wall
    return info


def run_kiln(kiln, model, files, batch, out, precision):
    t0 = time.perf_counter()
    with open(out, "w") as f:
        r = subprocess.run([kiln, "predict", "--model", model, "--json", "--top-k", "5", "--batch-size", str(batch),
                            "--mode", "jit", "--precision", precision] + files, check=True, stdout=f,
                           stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "summary": r.stderr.strip().splitlines()[-1]}


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit-base", choices=sorted(common.PRESETS) + ["resnet-50"])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                    help="fp32; bf16: kiln --precision bf16 beside the pipeline with dtype=torch.bfloat16")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--work", default="/tmp/kiln-bench-predict")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    files, distinct = photos(os.path.join(a.work, "photos"), a.images)
    model = os.path.join(a.work, "model")
    kind = save_model(model, a.model)
    n = len(files)
    result = {
        "date": time.strftime("%Y-%m-%d"), "cpu": benchutil.cpu_model(), "cores": os.cpu_count(),
        "model": a.model, "images": n, "distinct_photos": distinct, "batch_size": a.batch_size,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "pillow": PIL.__version__,
                     "python": platform.python_version()},
        "command": " ".join([os.path.relpath(sys.executable, ROOT)] + sys.argv),
    }
    for precision in a.precision:
        runs = {"pipeline": [], "kiln": []}
        out_p, out_k = os.path.join(a.work, f"pipeline-{precision}.jsonl"), os.path.join(a.work, f"kiln-{precision}.jsonl")
        for rep in range(a.repeats):  # alternating: neither peer gets the quieter machine
            runs["pipeline"].append(run_pipeline(model, files, a.batch_size, out_p, precision, kind))
            runs["kiln"].append(run_kiln(a.kiln, model, files, a.batch_size, out_k, "bf16" if precision == "bf16" else "fp32"))
            print(f"{precision} repeat {rep + 1}: pipeline {runs['pipeline'][-1]['wall_s']:.2f} s "
                  f"(calls {runs['pipeline'][-1]['predict_s']:.2f} s), kiln {runs['kiln'][-1]['wall_s']:.2f} s",
                  flush=True)
        want, got = read(out_p), read(out_k)
        worst, same_labels = 0.0, 0
        for w, g in zip(want, got):
            assert w["file"] == g["file"], (w["file"], g["file"])
            same_labels += [p["label"] for p in w["predictions"]] == [p["label"] for p in g["predictions"]]
            for pw, pg in zip(w["predictions"], g["predictions"]):
                if pw["label"] == pg["label"]:
                    worst = max(worst, abs(pw["score"] - pg["score"]))
        med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
        calls = statistics.median(r["predict_s"] for r in runs["pipeline"])
        result[precision] = {
            "runs": runs,
            "images_per_s": {"pipeline": n / med["pipeline"], "pipeline_calls_only": n / calls, "kiln": n / med["kiln"]},
            "speedup": med["pipeline"] / med["kiln"], "speedup_vs_calls_only": calls / med["kiln"],
            "max_score_difference": worst, "same_top5_order": f"{same_labels}/{n}",
        }
        print(json.dumps({k: v for k, v in result[precision].items() if k != "runs"}, indent=2), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
