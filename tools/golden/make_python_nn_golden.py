"""Writes tests/fixtures/python_nn/golden.npz: PyTorch's values and gradients
for python/tests/test_conv.py and test_layers.py, so that kiln's Python tests
check its convolution, pooling, normalization, layers and attention against
torch.nn without PyTorch installed. Every input is drawn with numpy exactly as
the tests draw it (the seeds and order are the tests'); only torch's results
are stored.

    bench/peers/.venv/bin/python tools/golden/make_python_nn_golden.py

(any Python with torch >= 2.0 and numpy; bench/peers/setup_venv.sh makes one).
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "python_nn",
                   "golden.npz")

# test_conv.py's cases, in its order.
CONV_KWS = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(padding="same", groups=2),
    dict(stride=3, padding="valid"),
]
# test_layers.py's nn.Conv2d cases, in its order.
LAYER_CONV_KWS = [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=3, stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(kernel_size=7, padding=3, groups=4),
    dict(kernel_size=3, padding="same", groups=2),
    dict(kernel_size=4, stride=4),
]


def t64(rng, *shape):  # test_conv.py's _both: float64 draws
    return torch.tensor(rng.standard_normal(shape).astype(np.float64), requires_grad=True)


def x32(seed, *shape):  # test_layers.py's _x
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def npy(t):
    return t.detach().numpy().copy()


def conv_cases(out):
    for i, kw in enumerate(CONV_KWS):
        rng = np.random.default_rng(0)
        tx, tw, tb = t64(rng, 2, 4, 9, 8), t64(rng, 6, 4 // kw.get("groups", 1), 3, 3), t64(rng, 6)
        ty = F.conv2d(tx, tw, tb, **kw)
        (ty ** 2).sum().backward()
        out[f"conv2d/{i}/y"] = npy(ty)
        for name, t in (("dx", tx), ("dw", tw), ("db", tb)):
            out[f"conv2d/{i}/{name}"] = t.grad.numpy().copy()
    rng = np.random.default_rng(1)
    tx, tw = t64(rng, 2, 3, 7, 7), t64(rng, 5, 3, 3, 3)
    out["conv2d_strided/y"] = npy(F.conv2d(tx, tw, stride=2, padding=1))
    tx1, tw1 = t64(rng, 2, 3, 11), t64(rng, 4, 3, 3)
    out["conv1d/y"] = npy(F.conv1d(tx1, tw1, padding="same", dilation=2))

    rng = np.random.default_rng(2)
    tx = t64(rng, 2, 3, 9, 8)
    out["max_pool2d/y"] = npy(F.max_pool2d(tx, 3, 2, 1))
    out["avg_pool2d/y"] = npy(F.avg_pool2d(tx, 3, 2, 1, count_include_pad=False))
    out["adaptive_avg_pool2d/y"] = npy(F.adaptive_avg_pool2d(tx, (4, 3)))
    (F.max_pool2d(tx, 3, 2, 1) ** 2).sum().backward()
    out["max_pool2d/dx"] = tx.grad.numpy().copy()

    rng = np.random.default_rng(3)
    tx = t64(rng, 4, 3, 5, 5)
    trm, trv = torch.tensor(np.array([0.1, -0.2, 0.3])), torch.tensor(np.array([1.0, 2.0, 0.5]))
    out["batch_norm/y"] = npy(F.batch_norm(tx, trm, trv, training=True, momentum=0.2))
    out["batch_norm/running_mean"], out["batch_norm/running_var"] = trm.numpy(), trv.numpy()
    tw, tx6 = t64(rng, 6), t64(rng, 2, 6, 3, 4)
    out["group_norm/y"] = npy(F.group_norm(tx6, 3, tw))


def layer_cases(out):
    w, b, x = x32(20, 4, 6), x32(21, 4), x32(1, 3, 6)
    tfc = torch.nn.Linear(6, 4)
    tfc.weight.data, tfc.bias.data = torch.tensor(w), torch.tensor(b)
    ty = tfc(torch.tensor(x))
    ty.pow(2).sum().backward()
    out["linear/y"], out["linear/dw"] = npy(ty), tfc.weight.grad.numpy().copy()

    x = x32(3, 2, 4, 13, 12)
    for i, kw in enumerate(LAYER_CONV_KWS):
        k, groups = kw["kernel_size"], kw.get("groups", 1)
        tconv = torch.nn.Conv2d(4, 8, **kw)
        tconv.weight.data = torch.tensor(x32(22 + i, 8, 4 // groups, k, k))
        tconv.bias.data = torch.tensor(x32(32 + i, 8))
        out[f"layer_conv2d/{i}/y"] = npy(tconv(torch.tensor(x)))

    x, w, b = x32(8, 2, 3, 5), x32(6, 5), x32(7, 5)
    out["layer_norm/y"] = npy(F.layer_norm(torch.tensor(x), (5,), torch.tensor(w), torch.tensor(b), 1e-6))

    tbn = torch.nn.BatchNorm2d(3)
    x = torch.tensor(x32(9, 4, 3, 5, 5) * 2 + 1)
    out["batch_norm2d/y_train"] = npy(tbn(x))
    out["batch_norm2d/running_mean"] = tbn.running_mean.numpy().copy()
    out["batch_norm2d/running_var"] = tbn.running_var.numpy().copy()
    tbn.eval()
    out["batch_norm2d/y_eval"] = npy(tbn(x))

    # nn.MultiHeadAttention(8, 2): query, key, value and output projections.
    p = {}
    for j, name in enumerate(("query", "key", "value", "output")):
        p[f"{name}.weight"], p[f"{name}.bias"] = torch.tensor(x32(40 + j, 8, 8)), torch.tensor(x32(50 + j, 8))
    tx = torch.tensor(x32(10, 2, 5, 8))

    def heads(name):
        return (tx @ p[f"{name}.weight"].T + p[f"{name}.bias"]).reshape(2, 5, 2, 4).transpose(1, 2)

    ctx = F.scaled_dot_product_attention(heads("query"), heads("key"), heads("value"))
    out["attention/y"] = npy(ctx.transpose(1, 2).reshape(2, 5, 8) @ p["output.weight"].T + p["output.bias"])

    rng = np.random.default_rng(12)
    B, T, S, H, D = 2, 5, 7, 2, 4
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((B, T, H, D), (B, S, H, D), (B, S, H, D)))
    bias = rng.standard_normal((1, H, T, S)).astype(np.float32)
    keep = np.ones((B, S), bool)
    keep[0, 5:] = False
    w = rng.standard_normal((B, T, H, D)).astype(np.float32)
    # kiln's causal mask is aligned to the last key (query i sees keys j <= i + S - T):
    # torch's is_causal aligns to the first, so it gets the mask spelled out.
    allowed = np.tril(np.ones((T, S), bool), S - T)[None, None] & keep[:, None, None, :]
    tq, tk, tv = (torch.tensor(a.transpose(0, 2, 1, 3), requires_grad=True) for a in (q, k, v))
    tb = torch.tensor(bias, requires_grad=True)
    mask = torch.where(torch.tensor(allowed), tb, torch.tensor(-np.inf))
    ty = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    (ty.transpose(1, 2) * torch.tensor(w)).sum().backward()
    out["sdpa/y"] = npy(ty.transpose(1, 2))
    for name, t in (("dq", tq), ("dk", tk), ("dv", tv)):
        out[f"sdpa/{name}"] = t.grad.transpose(1, 2).numpy().copy()
    out["sdpa/dbias"] = tb.grad.numpy().copy()


def main():
    torch.manual_seed(0)
    out = {}
    conv_cases(out)
    layer_cases(out)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    tmp = OUT + ".partial.npz"
    np.savez_compressed(tmp, **out)
    os.replace(tmp, OUT)
    print(f"wrote {len(out)} arrays to {os.path.normpath(OUT)} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
