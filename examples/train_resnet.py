"""A ResNet trained from Python on Fashion-MNIST: transformers'
ResNetForImageClassification (the resnet-fmnist preset: ResNet-18 with one
channel and 10 labels) through kiln.models, its BatchNorm statistics carried
through a jitted step beside the parameters, evaluated with them.

    python examples/train_resnet.py --epochs 2
"""
import argparse

import numpy as np

import kiln

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
p.add_argument("--batch-size", type=int, default=128)
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--preset", default="resnet-fmnist")
p.add_argument("--save", default="", help="write a folder transformers loads")
a = p.parse_args()

train_set, test_set = kiln.data.FashionMNIST("train"), kiln.data.FashionMNIST("test")
model = kiln.models.from_preset(a.preset).with_labels(train_set.classes)
params, state = model.init(kiln.random.key(0)), model.init_state()
opt = kiln.optim.AdamW(lr=a.lr, weight_decay=0.05)
opt_state = opt.init(params)


@kiln.jit(donate_argnums=(0, 1, 2))
def train_step(params, state, opt_state, x, y):
    def loss_fn(p):
        logits, new_state = model.apply(p, state, x, train=True)  # batch statistics
        return model.loss(logits, y), new_state

    (loss, state), grads = kiln.value_and_grad(loss_fn, has_aux=True)(params)
    params, opt_state = opt.update(grads, opt_state, params)
    return params, state, opt_state, loss


@kiln.jit
def predict(params, state, x):
    logits, _ = model.apply(params, state, x)  # the running statistics
    return kiln.argmax(logits, axis=-1)


train = kiln.data.Loader(train_set, batch_size=a.batch_size, shuffle=True)
test = kiln.data.Loader(test_set, batch_size=1000, drop_last=False)
for epoch in range(a.epochs):
    losses = []
    for i, (x, y, *_) in enumerate(train):
        if a.steps and i == a.steps:
            break
        params, state, opt_state, loss = train_step(params, state, opt_state, x, y)
        losses.append(loss)
    correct = sum(int(np.sum(np.asarray(predict(params, state, x)) == np.asarray(y)))
                  for x, y, *_ in test)
    print(f"epoch {epoch + 1}: train loss {np.mean([l.item() for l in losses]):.4f}, "
          f"test accuracy {correct / 10000:.2%}")
if a.save:
    model.save_pretrained(a.save, params, state)
    print(f"saved to {a.save}")
