#!/usr/bin/env bash
# The transfer experiment: pretrain a ViT (or, with FAMILY=deit, a DeiT of
# the same size, a distillation token and head beside the class token's) on
# Fashion-MNIST with kiln, then
# fine-tune that checkpoint at another resolution on a second real data set,
# scikit-learn's 8x8 handwritten digits (1797 images, written out as an image
# folder of PNGs), beside the same model trained from scratch on the digits
# with the same budget (steps, batch, optimizer, schedule). Writes the logs,
# results.json, curves.png (held-out accuracy against steps) and README.md
# into OUT.
#
#   bash bench/transfer/run.sh bench/results/2026-12-02-transfer
#
# Needs build/kiln (bash scripts/build.sh), Debian's dataset-fashion-mnist
# (scripts/setup.sh) and the peers' venv for scikit-learn and matplotlib
# (bash bench/peers/setup_venv.sh --gpu-machine; PYTHON overrides).
#   PRETRAIN_EPOCHS (3), FINETUNE_EPOCHS (30), IMAGE_SIZE (21: 3x3 patches of 7),
#   FAMILY (vit: the vit-fmnist preset; deit: its DeiTForImageClassification)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/transfer/run.sh OUT}
python=${PYTHON:-bench/peers/.venv-gpu-machine/bin/python}
kiln=build/kiln
pre_epochs=${PRETRAIN_EPOCHS:-3}
ft_epochs=${FINETUNE_EPOCHS:-30}
size=${IMAGE_SIZE:-21}
family=${FAMILY:-vit}
case "$family" in vit | deit) ;; *) echo "bench/transfer/run.sh: FAMILY is '$family', expected vit or deit" >&2; exit 2 ;; esac
work=${WORK:-/tmp/kiln-transfer}
rm -rf "$work"
mkdir -p "$work" "$out"

# The digits as an image folder: one sub-folder per digit, grey PNGs (0-16 scaled to 0-255).
"$python" - "$work/digits" <<'PY'
import os, sys
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
d = load_digits()
for i, (img, label) in enumerate(zip(d.images, d.target)):
    folder = os.path.join(sys.argv[1], str(label))
    os.makedirs(folder, exist_ok=True)
    Image.fromarray(np.round(img * 255 / 16).astype(np.uint8), "L").save(os.path.join(folder, f"{i:04d}.png"))
print(len(d.images), "digits written")
PY

# 1. Pretrain on Fashion-MNIST (28x28, 4x4 patches of 7).
common=(--mode jit --optimizer adamw --weight-decay 0.05 --exempt-from-decay --schedule cosine)
model=(--model vit-fmnist)
if [ "$family" = deit ]; then
  # vit-fmnist's dimensions as a DeiT (model_type deit: a config.json as transformers writes it).
  cat > "$work/deit-fmnist.json" <<'JSON'
{"model_type": "deit", "architectures": ["DeiTForImageClassification"], "hidden_size": 128,
 "num_hidden_layers": 6, "num_attention_heads": 4, "intermediate_size": 256, "image_size": 28,
 "patch_size": 7, "num_channels": 1, "num_labels": 10}
JSON
  model=(--config "$work/deit-fmnist.json")
fi
"$kiln" train --data fashion-mnist "${model[@]}" --batch-size 128 --lr 2e-3 --lr-warmup 100 \
  --epochs "$pre_epochs" --save "$work/pretrained" --log-json "$out/pretrain.jsonl" "${common[@]}" \
  | tee "$out/pretrain.txt"

# 2. Fine-tune it on the digits at IMAGE_SIZE (position embeddings resampled,
#    a new classifier for the digits' 10 labels), and 3. train the same model
#    from scratch with the same budget.
budget=(--data "imagefolder:$work/digits" --batch-size 64 --lr 1e-3 --lr-warmup 20 --epochs "$ft_epochs"
        --eval-every 25 --augment --seed 1 "${common[@]}")
"$kiln" train --init-from "$work/pretrained" --image-size "$size" "${budget[@]}" \
  --log-json "$out/finetuned.jsonl" | tee "$out/finetuned.txt"
config=$work/scratch-config.json
"$python" - "$work/pretrained/config.json" "$config" "$size" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["image_size"] = int(sys.argv[3])
c.pop("id2label", None), c.pop("label2id", None)
c["num_labels"] = 10
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
"$kiln" train --config "$config" "${budget[@]}" --log-json "$out/scratch.jsonl" | tee "$out/scratch.txt"

# Curves and the table.
"$python" - "$out" "$pre_epochs" "$ft_epochs" "$size" "$family" <<'PY'
import json, os, sys, time
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out, pre_epochs, ft_epochs, size, family = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def evals(name):
    rows = [json.loads(l) for l in open(os.path.join(out, name + ".jsonl"))]
    return [(r["step"], r["eval_accuracy"], r["eval_loss"]) for r in rows if "eval_accuracy" in r and "summary" not in r]
def summary(name):
    return [json.loads(l) for l in open(os.path.join(out, name + ".jsonl")) if '"summary"' in l][-1]
ft, sc, pre = evals("finetuned"), evals("scratch"), evals("pretrain")
sys.path.insert(0, "bench")
import benchutil
cpu = benchutil.cpu_model()
res = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "family": family, "pretrain_epochs": pre_epochs, "finetune_epochs": ft_epochs,
       "image_size": size, "pretrain_final_accuracy": pre[-1][1],
       "finetuned": {"final_accuracy": ft[-1][1], "best_accuracy": max(a for _, a, _ in ft), "curve": ft,
                     "wall_seconds": summary("finetuned")["wall_seconds"]},
       "scratch": {"final_accuracy": sc[-1][1], "best_accuracy": max(a for _, a, _ in sc), "curve": sc,
                   "wall_seconds": summary("scratch")["wall_seconds"]}}
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=2)
plt.figure(figsize=(7, 4.2))
plt.plot([s for s, _, _ in ft], [100 * a for _, a, _ in ft], "o-", ms=3, label="fine-tuned from Fashion-MNIST")
plt.plot([s for s, _, _ in sc], [100 * a for _, a, _ in sc], "s-", ms=3, label="from scratch")
plt.xlabel("step (batch 64)"); plt.ylabel("held-out accuracy (%)")
name = "ViT (vit-fmnist)" if family == "vit" else "DeiT (vit-fmnist's size)"
plt.title(f"sklearn digits at {size}x{size}: {name} fine-tuned vs from scratch")
plt.grid(alpha=0.3); plt.legend(); plt.tight_layout()
plt.savefig(os.path.join(out, "curves.png"), dpi=120)
print(json.dumps({k: v for k, v in res.items() if k not in ("finetuned", "scratch")}))
print("fine-tuned: final", ft[-1][1], "best", res["finetuned"]["best_accuracy"])
print("scratch:    final", sc[-1][1], "best", res["scratch"]["best_accuracy"])
PY
