"""kiln.models with GPT-2 (transformers' golden fixtures: logits, loss,
gradients, greedy generation), kiln.data.Tokenizer (tokenizers' ids on the
GNU GPL v2), and a jitted fine-tuning step."""
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


@pytest.mark.parametrize("variant", ["tied", "untied"])
def test_gpt2_matches_transformers(variant):
    folder = os.path.join(FIXTURES, "gpt2_golden", variant)
    model, params, state = kiln.models.from_pretrained(folder)
    assert model.causal_lm and model.architecture == "GPT2LMHeadModel"
    assert state == {}
    batch, expected = _load(folder, "batch.safetensors"), _load(folder, "expected.safetensors")
    ids, labels = batch["input_ids"], batch["labels"]
    logits, _ = model.apply(params, {}, ids)
    assert _rel(logits, expected["logits"]) < 1e-5
    loss, grads = kiln.value_and_grad(
        lambda p: model.loss(model.apply(p, {}, ids, train=True)[0], labels))(params)
    assert abs(loss.item() - expected["loss"].item()) < 1e-5 * expected["loss"].item()
    assert set(grads) == set(params)
    for n, g in grads.items():
        assert _rel(g, expected["grad." + n]) < 1e-4, n
    # Greedy generation, token for token as model.generate(do_sample=False).
    prompt, want = np.asarray(expected["prompt"]), np.asarray(expected["generated"])
    got = model.generate(params, prompt, max_new_tokens=want.shape[1] - prompt.shape[1],
                         eos_token_id=-1)
    np.testing.assert_array_equal(np.asarray(got), want)
    eager = model.generate(params, prompt, max_new_tokens=want.shape[1] - prompt.shape[1],
                           eos_token_id=-1, compiled=False)
    np.testing.assert_array_equal(np.asarray(eager), want)


def test_sampling_repeats_by_seed():
    model, params, _ = kiln.models.from_pretrained(os.path.join(FIXTURES, "gpt2_golden", "tied"))
    run = lambda **k: np.asarray(model.generate(params, [5, 6, 7], 8, eos_token_id=-1, **k))
    a = run(temperature=1.0, top_k=20, top_p=0.9, seed=3)
    assert a.shape == (1, 11)
    np.testing.assert_array_equal(a, run(temperature=1.0, top_k=20, top_p=0.9, seed=3,
                                          compiled=False))
    assert not np.array_equal(a, run(temperature=1.0, top_k=20, top_p=0.9, seed=4))
    with pytest.raises(kiln.KilnError, match="more than the model's n_positions 40"):
        model.generate(params, list(range(30)), 11)
    vit = kiln.models.from_preset("vit-tiny")
    with pytest.raises(kiln.KilnError, match="not a language model"):
        vit.generate({}, [1, 2], 2)


def test_inference_params_round_the_matmul_weights_once():
    model, params, _ = kiln.models.from_pretrained(os.path.join(FIXTURES, "gpt2_golden", "tied"))
    prepared = model.inference_params(params, "bf16")
    assert prepared["lm_head.weight"].dtype == kiln.bfloat16  # the tied head's copy
    assert prepared["transformer.h.0.attn.c_attn.weight"].dtype == kiln.bfloat16
    assert prepared["transformer.wte.weight"].dtype == kiln.float32
    run = lambda p: np.asarray(model.generate(p, [5, 6, 7], 6, eos_token_id=-1, precision="bf16"))
    np.testing.assert_array_equal(run(prepared), run(params))
    assert model.inference_params(params, "fp32").keys() == params.keys()
    with pytest.raises(kiln.KilnError, match="not a language model"):
        kiln.models.from_preset("vit-tiny").inference_params({}, "bf16")


def test_tokenizer_gives_tokenizers_ids():
    folder = os.path.join(FIXTURES, "tokenizer_golden")
    tok = kiln.data.Tokenizer.from_folder(folder)
    with open(os.path.join(folder, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    assert tok.vocab_size == expected["vocab_size"]
    for case in expected["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["name"]
        assert tok.decode(case["ids"]) == case["decoded"], case["name"]
    assert tok.token_id("<|endoftext|>") == 0
    assert tok.token_id("no such token") is None
    with pytest.raises(kiln.KilnError, match="tokenizer.json"):
        kiln.data.Tokenizer.from_folder(os.path.join(FIXTURES, "gpt2_golden", "tied"))


def test_a_jitted_finetuning_step_lowers_the_loss():
    model, params, _ = kiln.models.from_pretrained(os.path.join(FIXTURES, "gpt2_golden", "tied"))
    ids = kiln.asarray((np.arange(4 * 16).reshape(4, 16) * 7 % 97).astype(np.int32))
    opt = kiln.optim.AdamW(lr=3e-3, weight_decay=0.0)
    state = opt.init(params)

    @kiln.jit
    def step(params, state, x):
        loss, grads = kiln.value_and_grad(lambda p: model.loss(model.apply(p, {}, x)[0], x))(params)
        params, state = opt.update(grads, state, params)
        return params, state, loss

    losses = []
    for _ in range(10):
        params, state, loss = step(params, state, ids)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
