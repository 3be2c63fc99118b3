"""kiln.models: every family made from config.json by model_type, checked
against transformers through the committed golden fixtures (logits, loss,
gradients and BatchNorm statistics), presets, head swaps, save_pretrained,
and the errors of unknown model types."""
import json
import os

import numpy as np
import pytest

import kiln

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")


def _load(*path):
    return kiln._kiln.load_safetensors(os.path.join(FIXTURES, *path))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("name", ["resnet_basic_golden", "resnet_bottleneck_golden",
                                  "convnext_golden"])
def test_the_families_match_transformers(name):
    model, params, state = kiln.models.from_pretrained(os.path.join(FIXTURES, name))
    assert model.model_type == name.split("_")[0]
    batch, expected = _load(name, "batch.safetensors"), _load(name, "expected.safetensors")
    x, y = batch["pixel_values"], batch["labels"]

    def loss_fn(p):
        logits, _ = model.apply(p, state, x, train=True)
        return model.loss(logits, y)

    logits, new_state = model.apply(params, state, x, train=True)
    assert _rel(logits, expected["logits"]) < 1e-5
    loss, grads = kiln.value_and_grad(loss_fn)(params)
    assert abs(loss.item() - expected["loss"].item()) < 1e-5 * abs(expected["loss"].item())
    assert set(grads) == set(params)
    for n, g in grads.items():
        assert _rel(g, expected["grad." + n]) < 1e-4, n
    for n, v in new_state.items():
        if n.endswith("num_batches_tracked"):
            assert int(v.item()) == int(expected["state." + n].item()), n
        else:
            assert _rel(v, expected["state." + n]) < 1e-5, n
    if state:  # evaluation normalizes by the running statistics, which stay
        eval_logits, same = model.apply(params, state, x)
        assert _rel(eval_logits, expected["eval_logits"]) < 1e-5
        assert all(np.array_equal(np.asarray(same[n]), np.asarray(state[n])) for n in state)


def test_presets_configs_and_head_swaps(tmp_path):
    assert kiln.models.model_types() == ["convnext", "deit", "gpt2", "resnet", "vit"]
    assert {"resnet-50", "convnext-tiny", "deit-small", "vit-base"} <= set(kiln.models.presets())
    r50 = kiln.models.from_preset("resnet-50")
    assert r50.architecture == "ResNetForImageClassification"
    assert sum(int(np.prod(s)) for s in r50.parameter_shapes().values()) == 25557032
    tiny = kiln.models.from_config({"model_type": "resnet", "embedding_size": 8,
                                    "hidden_sizes": [8, 16], "depths": [1, 1],
                                    "layer_type": "basic", "num_labels": 4})
    swapped = tiny.with_labels(["cat", "dog"])
    assert swapped.labels == ["cat", "dog"]
    assert swapped.head_parameters() == {"classifier.1.weight", "classifier.1.bias"}
    params, state = swapped.init(kiln.random.key(0)), swapped.init_state()
    assert params["classifier.1.weight"].shape == (2, 16)
    swapped.save_pretrained(tmp_path / "saved", params, state)
    with open(tmp_path / "saved" / "config.json") as f:
        assert json.load(f)["id2label"] == {"0": "cat", "1": "dog"}
    back, p2, s2 = kiln.models.from_pretrained(tmp_path / "saved")
    assert back.config == swapped.config
    assert all(np.array_equal(np.asarray(p2[n]), np.asarray(params[n])) for n in params)
    assert s2["resnet.embedder.embedder.normalization.num_batches_tracked"].item() == 0
    relabeled = kiln.models.from_pretrained(tmp_path / "saved", labels=["a", "b", "c"])
    assert relabeled.model.labels == ["a", "b", "c"]
    assert relabeled.params["classifier.1.bias"].shape == (3,)
    with pytest.raises(kiln.KilnError, match='"bert", which kiln does not have; its model types: '
                                             '"convnext", "deit", "gpt2", "resnet", "vit"'):
        kiln.models.from_config({"model_type": "bert"})
    with pytest.raises(kiln.KilnError, match="not a ViT; kiln.models.from_pretrained"):
        kiln.nn.ViTConfig.from_pretrained(os.path.join(FIXTURES, "resnet_basic_golden"))


def test_a_jitted_training_step_carries_the_statistics():
    model = kiln.models.from_config({"model_type": "resnet", "embedding_size": 8,
                                     "hidden_sizes": [8, 16], "depths": [1, 1],
                                     "layer_type": "basic", "num_labels": 3})
    params, state = model.init(kiln.random.key(1)), model.init_state()
    opt = kiln.optim.SGD(lr=0.1, momentum=0.9)
    opt_state = opt.init(params)

    def step(params, state, opt_state, x, y):
        def loss_fn(p):
            logits, new_state = model.apply(p, state, x, train=True)
            return model.loss(logits, y), new_state
        (loss, new_state), grads = kiln.value_and_grad(loss_fn, has_aux=True)(params)
        params, opt_state = opt.update(grads, opt_state, params)
        return params, new_state, opt_state, loss

    x = kiln.random.normal(kiln.random.key(2), (4, 3, 16, 16))
    y = kiln.array(np.array([0, 1, 2, 1], np.int64))
    eager = step(params, state, opt_state, x, y)
    jitted = kiln.jit(step)(params, state, opt_state, x, y)
    for a, b in zip(eager[:2], jitted[:2]):
        for n in a:
            assert _rel(a[n], b[n]) < 1e-5, n
    assert eager[1]["resnet.embedder.embedder.normalization.num_batches_tracked"].item() == 1


def test_layer_decay_scales_feed_the_optimizers():
    model = kiln.models.from_config({"model_type": "resnet", "embedding_size": 8,
                                     "hidden_sizes": [8, 16], "depths": [2, 1],
                                     "layer_type": "basic", "num_labels": 3})
    scales = model.layer_decay_scales(0.5)
    # The stem, three residual layers, the classifier: 0.5^4 ... 1.
    assert scales["resnet.embedder.embedder.convolution.weight"] == 0.0625
    assert scales["resnet.encoder.stages.0.layers.1.layer.0.convolution.weight"] == 0.25
    assert scales["resnet.encoder.stages.1.layers.0.shortcut.convolution.weight"] == 0.5
    assert scales["classifier.1.weight"] == 1.0
    params = model.init(kiln.random.key(1))
    grads = {n: kiln.ones_like(p) for n, p in params.items()}
    for opt in (kiln.optim.SGD(lr=0.1, lr_scale=scales),
                kiln.optim.AdamW(lr=0.1, weight_decay=0.0, lr_scale=scales)):
        new, _ = opt.update(grads, opt.init(params), params)
        for n in params:
            moved = np.asarray(params[n]) - np.asarray(new[n])
            np.testing.assert_allclose(moved, 0.1 * scales[n], rtol=1e-4, err_msg=n)
    with pytest.raises(kiln.KilnError, match=r"expected a value in \(0, 1\]"):
        model.layer_decay_scales(0.0)
