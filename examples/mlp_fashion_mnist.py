"""A model written in Python, trained with kiln: a two-layer MLP on
Fashion-MNIST with value_and_grad, AdamW and jit, evaluated on the test
split.

    python examples/mlp_fashion_mnist.py --epochs 3
"""
import argparse

import numpy as np

import kiln
import kiln.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch-size", type=int, default=128)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--lr", type=float, default=1e-3)
a = p.parse_args()


def init(key, sizes):
    params = []
    for k, (n_in, n_out) in zip(kiln.random.split(key, len(sizes) - 1), zip(sizes, sizes[1:])):
        w = kiln.random.truncated_normal(k, -2, 2, (n_out, n_in)) * (2.0 / n_in) ** 0.5
        params.append({"weight": w, "bias": kiln.zeros((n_out,))})
    return params


def apply(params, x):
    x = x.reshape(x.shape[0], -1)
    for layer in params[:-1]:
        x = kiln.relu(F.linear(x, layer["weight"], layer["bias"]))
    return F.linear(x, params[-1]["weight"], params[-1]["bias"])


def loss_fn(params, x, y):
    return F.cross_entropy(apply(params, x), y)


opt = kiln.optim.AdamW(lr=a.lr, weight_decay=1e-4)


@kiln.jit(donate_argnums=(0, 1))
def train_step(params, state, x, y):
    loss, grads = kiln.value_and_grad(loss_fn)(params, x, y)
    params, state = opt.update(grads, state, params)
    return params, state, loss


@kiln.jit
def predict(params, x):
    return kiln.argmax(apply(params, x), axis=-1)


params = init(kiln.random.key(0), [28 * 28, a.hidden, a.hidden, 10])
state = opt.init(params)
train = kiln.data.Loader(kiln.data.FashionMNIST("train"), batch_size=a.batch_size, shuffle=True)
test = kiln.data.Loader(kiln.data.FashionMNIST("test"), batch_size=1000, drop_last=False)
for epoch in range(a.epochs):
    losses = []
    for x, y, *_ in train:
        params, state, loss = train_step(params, state, x, y)
        losses.append(loss)
    correct = sum(int(np.sum(np.asarray(predict(params, x)) == np.asarray(y))) for x, y, *_ in test)
    print(f"epoch {epoch + 1}: train loss {np.mean([l.item() for l in losses]):.4f}, "
          f"test accuracy {correct / 10000:.2%}")
print(f"compilations: {train_step.cache_stats()['compiles']} (train), "
      f"{predict.cache_stats()['compiles']} (predict)")
