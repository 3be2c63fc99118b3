"""kiln's convolution, pooling and channel normalization against PyTorch's
torch.nn.functional (values and gradients)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln


def _np(x):
    return np.asarray(x)


def _both(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float64)
    return kiln.array(a), torch.tensor(a, requires_grad=True)


@pytest.mark.parametrize("kw", [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(padding="same", groups=2),
    dict(stride=3, padding="valid"),
])
def test_conv2d_and_its_gradients_match_torch(kw):
    rng = np.random.default_rng(0)
    x, tx = _both(rng, 2, 4, 9, 8)
    w, tw = _both(rng, 6, 4 // kw.get("groups", 1), 3, 3)
    b, tb = _both(rng, 6)
    y = kiln.conv2d(x, w, b, **kw)
    ty = F.conv2d(tx, tw, tb, **kw)
    np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = kiln.grad(lambda a, c, d: kiln.sum(kiln.square(kiln.conv2d(a, c, d, **kw))),
                  argnums=(0, 1, 2))(x, w, b)
    (ty ** 2).sum().backward()
    for got, want in zip(g, (tx, tw, tb)):
        np.testing.assert_allclose(_np(got), want.grad.numpy(), rtol=1e-9, atol=1e-9)


def test_conv2d_channels_last_and_conv1d():
    rng = np.random.default_rng(1)
    x, tx = _both(rng, 2, 3, 7, 7)
    w, tw = _both(rng, 5, 3, 3, 3)
    y = kiln.conv2d(kiln.transpose(x, [0, 2, 3, 1]), w, stride=2, padding=1, channels_last=True)
    np.testing.assert_allclose(_np(y).transpose(0, 3, 1, 2),
                               F.conv2d(tx, tw, stride=2, padding=1).detach().numpy(), rtol=1e-10)
    x1, tx1 = _both(rng, 2, 3, 11)
    w1, tw1 = _both(rng, 4, 3, 3)
    np.testing.assert_allclose(_np(kiln.conv1d(x1, w1, padding="same", dilation=2)),
                               F.conv1d(tx1, tw1, padding="same", dilation=2).detach().numpy(),
                               rtol=1e-10)


def test_pooling_matches_torch():
    rng = np.random.default_rng(2)
    x, tx = _both(rng, 2, 3, 9, 8)
    np.testing.assert_allclose(_np(kiln.max_pool2d(x, 3, 2, 1)),
                               F.max_pool2d(tx, 3, 2, 1).detach().numpy())
    np.testing.assert_allclose(
        _np(kiln.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
        F.avg_pool2d(tx, 3, 2, 1, count_include_pad=False).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(_np(kiln.adaptive_avg_pool2d(x, 4, 3)),
                               F.adaptive_avg_pool2d(tx, (4, 3)).detach().numpy(), rtol=1e-12)
    g = kiln.grad(lambda a: kiln.sum(kiln.square(kiln.max_pool2d(a, 3, 2, 1))))(x)
    (F.max_pool2d(tx, 3, 2, 1) ** 2).sum().backward()
    np.testing.assert_allclose(_np(g), tx.grad.numpy())


def test_batch_norm_and_group_norm_match_torch():
    rng = np.random.default_rng(3)
    x, tx = _both(rng, 4, 3, 5, 5)
    rm, rv = np.array([0.1, -0.2, 0.3]), np.array([1.0, 2.0, 0.5])
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    y, m, v = kiln.batch_norm(x, kiln.array(rm), kiln.array(rv), training=True, momentum=0.2)
    ty = F.batch_norm(tx, trm, trv, training=True, momentum=0.2)
    np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(m), trm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(_np(v), trv.numpy(), rtol=1e-12)
    y, m, v = kiln.batch_norm(x)  # no running statistics: the batch's, and None back
    assert m is None and v is None
    w, tw = _both(rng, 6)
    x6, tx6 = _both(rng, 2, 6, 3, 4)
    np.testing.assert_allclose(_np(kiln.group_norm(x6, 3, w)),
                               F.group_norm(tx6, 3, tw).detach().numpy(), rtol=1e-9, atol=1e-12)


def test_bad_arguments_raise_kiln_errors():
    x = kiln.zeros([1, 3, 4, 4])
    with pytest.raises(kiln.KilnError, match="does not fit the input 4x4"):
        kiln.conv2d(x, kiln.zeros([2, 3, 5, 5]))
    with pytest.raises(kiln.KilnError, match="padding 'full'"):
        kiln.conv2d(x, kiln.zeros([2, 3, 1, 1]), padding="full")
