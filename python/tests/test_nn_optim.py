"""kiln.nn's ViT against transformers (the committed golden fixtures of
tests/fixtures, made by tools/golden) and kiln.optim against torch.optim."""
import os

import numpy as np
import pytest

import kiln

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")


def _load(*path):
    return kiln._kiln.load_safetensors(os.path.join(FIXTURES, *path))


@pytest.fixture(scope="module")
def golden():
    model, params = kiln.nn.ViTForImageClassification.from_pretrained(
        os.path.join(FIXTURES, "vit_golden"))
    return model, params, _load("vit_golden", "batch.safetensors"), _load(
        "vit_golden", "expected.safetensors")


def test_config_presets_and_fields():
    assert kiln.nn.ViTConfig().hidden_size == 768  # transformers' ViTConfig()
    c = kiln.nn.ViTConfig("vit-tiny", num_labels=7, image_size=(32, 48), hidden_act="gelu_new")
    assert (c.hidden_size, c.num_labels, c.image_size, c.hidden_act) == (192, 7, (32, 48),
                                                                       "gelu_new")
    assert "vit-fmnist" in kiln.nn.ViTConfig.preset_names()
    with pytest.raises(TypeError, match="no field 'hiden_size'"):
        kiln.nn.ViTConfig(hiden_size=3)
    with pytest.raises(kiln.KilnError, match="hidden_act 'swoosh'"):
        kiln.nn.ViTConfig(hidden_act="swoosh")
    with pytest.raises(kiln.KilnError, match="unknown preset|vit-huge"):
        kiln.nn.ViTConfig("vit-huge")


def test_vit_matches_transformers(golden):
    model, params, batch, expected = golden
    for layout, pixels in (("NCHW", batch["pixel_values"]), ("NHWC", batch["pixel_values_nhwc"])):
        logits = model.apply(params, pixels, layout=layout)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(expected["logits"]), rtol=1e-4,
                                   atol=1e-5)
    labels = batch["labels"]
    loss, grads = kiln.value_and_grad(
        lambda p: model.loss(model.apply(p, batch["pixel_values"]), labels))(params)
    assert loss.item() == pytest.approx(expected["loss"].item(), rel=1e-5)
    # relative L2 errors, with a floor of 1e-3 of all gradients' norm (the key
    # bias's gradient is zero up to rounding), as tests/nn/vit_golden_test.cpp
    floor = 1e-3 * np.sqrt(sum(np.sum(np.asarray(v, np.float64) ** 2)
                               for k, v in expected.items() if k.startswith("grad.")))
    assert len(grads) == len(params)
    for name, g in grads.items():
        want = np.asarray(expected["grad." + name], np.float64)
        err = np.linalg.norm(np.asarray(g) - want) / max(np.linalg.norm(want), floor)
        assert err < 1e-4, name


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_five_sgd_steps_match_torch(golden, mode):
    model, params, batch, expected = golden
    pixels, labels = batch["pixel_values"], batch["labels"]
    params = {k: kiln.array(v) for k, v in params.items()}  # the fixture's stay undonated
    opt = kiln.optim.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)
    state = opt.init(params)

    def step(p, s, x, y):
        loss, g = kiln.value_and_grad(lambda p: model.loss(model.apply(p, x), y))(p)
        p, s = opt.update(g, s, p)
        return p, s, loss

    if mode == "jit":
        step = kiln.jit(step, donate_argnums=(0, 1))
    want = np.asarray(expected["sgd_losses"])
    for k in range(5):
        params, state, loss = step(params, state, pixels, labels)
        assert loss.item() == pytest.approx(want[k], rel=1e-5), k
    assert state.step.item() == 5


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_adamw_schedule_and_clipping_match_torch(mode):
    f = _load("optim_golden", "adamw.safetensors")
    names = ["a", "b", "c"]
    params = {n: f[f"param/{n}"] for n in names}
    steps = len(np.asarray(f["norms"]))
    sched = kiln.optim.Schedule("cosine", warmup=2, total=steps)
    np.testing.assert_allclose([sched(k) for k in range(steps)], np.asarray(f["lr_factors"]),
                               rtol=1e-12)
    opt = kiln.optim.AdamW(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05,
                           schedule=sched)
    state = opt.init(params)

    def step(p, s, g):
        g, norm = kiln.optim.clip_by_global_norm(g, 1.5)
        p, s = opt.update(g, s, p)
        return p, s, norm

    if mode == "jit":
        step = kiln.jit(step)
    for k in range(steps):
        grads = {n: f[f"grad/{k}/{n}"] for n in names}
        params, state, norm = step(params, state, grads)
        assert norm.item() == pytest.approx(float(np.asarray(f["norms"])[k]), rel=1e-5)
        for n in names:
            np.testing.assert_allclose(np.asarray(params[n]), np.asarray(f[f"after/{k}/{n}"]),
                                       rtol=2e-5, atol=2e-6, err_msg=f"step {k} {n}")
    if mode == "jit":
        assert step.cache_stats()["compiles"] == 1  # the schedule follows the step array


def test_optimizers_take_any_tree():
    params = {"layer": [kiln.ones((2,)), kiln.full((3,), 2.0)], "bias": kiln.zeros((1,))}
    grads = kiln.tree.map(lambda p: kiln.ones_like(p), params)
    opt = kiln.optim.SGD(lr=0.5, momentum=0.9, nesterov=True)
    state = opt.init(params)
    assert sorted(state.buffers) == ["momentum/bias", "momentum/layer.0", "momentum/layer.1"]
    p1, state = opt.update(grads, state, params)
    # torch: buf = g on the first step; nesterov: g + momentum * buf
    np.testing.assert_allclose(np.asarray(p1["layer"][1]), 2.0 - 0.5 * (1 + 0.9))
    with pytest.raises(ValueError, match="structure"):
        opt.update({"layer": grads["layer"]}, state, params)


def test_save_and_load_pretrained_round_trip(tmp_path, golden):
    model, params, batch, _ = golden
    out = tmp_path / "saved"
    model.save_pretrained(out, params)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    m2, p2 = kiln.nn.ViTForImageClassification.from_pretrained(str(out))
    np.testing.assert_array_equal(np.asarray(m2.apply(p2, batch["pixel_values"])),
                                  np.asarray(model.apply(params, batch["pixel_values"])))
    m3, p3 = kiln.nn.ViTForImageClassification.from_pretrained(
        str(out), labels=["cat", "dog", "fish"], image_size=48)
    assert m3.config.num_labels == 3 and m3.config.id2label == ["cat", "dog", "fish"]
    assert p3["classifier.weight"].shape == (3, 32) and m3.config.image_size == 48
    assert any("classifier" in n for n in m3.notes)
    with pytest.raises(kiln.KilnError, match="classifier.weight"):
        model.save_pretrained(tmp_path / "bad", {**params, "classifier.weight": kiln.zeros((2, 2))})
    with pytest.raises(kiln.KilnError, match="not a folder, and not a Hub id"):
        kiln.nn.ViTForImageClassification.from_pretrained(str(tmp_path / "nowhere"))


def test_dropout_key_array_draws_anew_under_jit():
    cfg = kiln.nn.ViTConfig("vit-tiny", num_labels=3, image_size=16, patch_size=8,
                            num_hidden_layers=1, hidden_dropout_prob=0.5)
    model = kiln.nn.ViTForImageClassification(cfg)
    params = model.init(kiln.random.key(0))
    x = kiln.random.normal(kiln.random.key(1), (2, 3, 16, 16))
    f = kiln.jit(lambda p, x, k: model.apply(p, x, train=True, dropout_key=k))
    a = np.asarray(f(params, x, kiln.random.key_data(kiln.random.key(5))))
    b = np.asarray(f(params, x, kiln.random.key_data(kiln.random.key(6))))
    c = np.asarray(f(params, x, kiln.random.key_data(kiln.random.key(5))))
    assert not np.allclose(a, b) and np.array_equal(a, c)
    eager = np.asarray(model.apply(params, x, train=True, dropout_key=kiln.random.key(5)))
    np.testing.assert_allclose(eager, a, rtol=1e-5, atol=1e-6)


def test_a_jitted_forward_closing_over_the_parameters_folds_their_casts():
    cfg = kiln.nn.ViTConfig("vit-tiny", num_labels=3, image_size=16, patch_size=8,
                            num_hidden_layers=2)
    model = kiln.nn.ViTForImageClassification(cfg)
    params = model.init(kiln.random.key(0))
    x = kiln.random.normal(kiln.random.key(1), (2, 3, 16, 16))
    # params are captured, not arguments: constants, folded when it compiles
    f = kiln.jit(lambda x: model.apply(params, x, precision="bf16", inference=True))
    got = np.asarray(f(x))
    folded = f.last_compile()
    # per layer: the query/key/value weights and biases concatenated (2), the
    # weights of 4 linears cast to bf16; the patch and classifier weights cast
    assert folded["nodes_folded"] >= 2 * (2 + 4) + 2, folded
    assert folded["folded_bytes"] > 0
    eager = np.asarray(model.apply(params, x, precision="bf16", inference=True))
    np.testing.assert_allclose(got, eager, rtol=1e-3, atol=1e-3)
    # inference differs from training's forward by one bf16 rounding of the MLP's sum
    train_fwd = np.asarray(model.apply(params, x, precision="bf16"))
    np.testing.assert_allclose(got, train_fwd, rtol=0.05, atol=0.05)
    # with the parameters as arguments there is nothing to fold
    g = kiln.jit(lambda p, x: model.apply(p, x, precision="bf16", inference=True))
    np.testing.assert_allclose(np.asarray(g(params, x)), got, rtol=1e-6, atol=1e-6)
    assert g.last_compile()["nodes_folded"] == 0
