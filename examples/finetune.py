"""Fine-tune a pretrained ViT on an image folder (FOLDER/<class>/*.jpg):
the model from a folder that transformers saved or a Hub id, a new
classifier for the folder's classes (as ignore_mismatched_sizes), AdamW with
warm-up and cosine decay, one jitted step; evaluated on the held-out files
(every 10th of each class) and saved for transformers' from_pretrained.

    python examples/finetune.py --model google/vit-base-patch16-224-in21k \\
        --data path/to/folder --steps 500 --out finetuned
"""
import argparse

import numpy as np

import kiln

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="a folder that transformers saved, or a Hub id")
p.add_argument("--data", required=True, help="an image folder: DATA/<class>/<image>")
p.add_argument("--steps", type=int, default=500)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--lr", type=float, default=5e-5)
p.add_argument("--image-size", type=int, default=None, help="a new resolution")
p.add_argument("--out", required=True)
a = p.parse_args()

classes = kiln.data.ImageFolder(a.data).classes
model, params = kiln.nn.ViTForImageClassification.from_pretrained(
    a.model, labels=classes, image_size=a.image_size)
for note in model.notes:
    print(f"{a.model}: {note}")
size = model.config.image_size
train = kiln.data.ImageFolder(a.data, "train", image_size=size, augment=True)
holdout = kiln.data.ImageFolder(a.data, "holdout", image_size=size)
schedule = kiln.optim.Schedule("cosine", warmup=a.steps // 10, total=a.steps)
opt = kiln.optim.AdamW(lr=a.lr, weight_decay=0.01, exempt_from_decay=True, schedule=schedule)
state = opt.init(params)


@kiln.jit(donate_argnums=(0, 1))
def step(params, state, x, y):
    loss, grads = kiln.value_and_grad(lambda p: model.loss(model.apply(p, x), y))(params)
    params, state = opt.update(grads, state, params)
    return params, state, loss


@kiln.jit
def predict(params, x):
    return kiln.argmax(model.apply(params, x), axis=-1)


batches = kiln.data.Loader(train, batch_size=min(a.batch_size, len(train)), shuffle=True)
for i in range(1, a.steps + 1):
    x, y, *_ = next(batches)
    params, state, loss = step(params, state, x, y)
    if i % max(1, a.steps // 10) == 0 or i == a.steps:
        print(f"step {i}: loss {loss.item():.4f}")
right = sum(int(np.sum(np.asarray(predict(params, x)) == np.asarray(y)))
            for x, y, *_ in kiln.data.Loader(holdout, batch_size=64, drop_last=False, workers=0))
print(f"held-out accuracy {right / len(holdout):.2%} ({len(holdout)} images)")
model.save_pretrained(a.out, params)
print(f"saved {a.out} (transformers: ViTForImageClassification.from_pretrained)")
