"""The reference experiment on kiln from Python: HuggingFace's ViT (default
ViTConfig, 1000 labels) on random images, batch 32, SGD at lr 1e-3, in the
reference script's three modes: pytorch (eager), torch_xla (lazy) and jax
(jit). Same flags and printed lines as the reference script; a step is timed
from fetching its batch until its loss exists, warm-up steps left out.

    python examples/reference_experiment.py --mode jax --model vit-tiny
"""
import argparse
import time

import kiln

p = argparse.ArgumentParser(description="Toy Training Script.")
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--mode", choices=["pytorch", "jax", "torch_xla"], default="jax")
p.add_argument("--compile-model", action="store_true", help="pytorch mode: jit forward+backward")
p.add_argument("--model", default="vit-base", help="a preset: vit-tiny, vit-small, vit-base, ...")
p.add_argument("--steps", type=int, default=52)
p.add_argument("--warmup", type=int, default=11)
a = p.parse_args()
print(f"Mode: {a.mode} \nBatch size: {a.batch_size} \nCompile model: {a.compile_model}")

layout = "NHWC" if a.mode == "jax" else "NCHW"  # as the reference feeds Flax and PyTorch
model = kiln.nn.ViTForImageClassification(kiln.nn.ViTConfig(a.model))
params, opt = model.init(kiln.random.key(0)), kiln.optim.SGD(lr=1e-3)
state = opt.init(params)
data = kiln.data.RandomImages(num_labels=model.config.num_labels,
                              image_size=model.config.image_size, layout=layout)
loader = kiln.data.Loader(data, batch_size=a.batch_size, workers=2)
loss_and_grad = kiln.value_and_grad(lambda p, x, y: model.loss(model.apply(p, x, layout=layout), y))
if a.mode == "pytorch" and a.compile_model:
    loss_and_grad = kiln.jit(loss_and_grad)


def step(params, state, x, y):
    loss, grads = loss_and_grad(params, x, y)
    params, state = opt.update(grads, state, params)
    return params, state, loss


if a.mode == "jax":
    step = kiln.jit(step, donate_argnums=(0, 1))
times = []
for i in range(a.steps):
    t0 = time.perf_counter()
    x, y, *_ = next(loader)
    if a.mode == "torch_xla":
        with kiln.lazy():
            params, state, loss = step(params, state, x, y)
            kiln.mark_step(params, state, loss)
    else:
        params, state, loss = step(params, state, x, y)
    loss.item()  # the step's results exist
    if i >= a.warmup:
        times.append(time.perf_counter() - t0)
print(f"average step time: {sum(times) / len(times)}")
