"""The examples a user copies (examples/), run as a user runs them."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _run(script, *args):
    env = dict(os.environ)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("mode,compile_model", [("pytorch", False), ("pytorch", True),
                                                ("torch_xla", False), ("jax", False)])
def test_reference_experiment(mode, compile_model):
    args = ["--mode", mode, "--model", "vit-tiny", "--batch-size", "2", "--steps", "3",
            "--warmup", "1"] + (["--compile-model"] if compile_model else [])
    out = _run("reference_experiment.py", *args)
    lines = out.splitlines()
    # the reference script's header, byte for byte, and its last line
    assert lines[:3] == [f"Mode: {mode} ", "Batch size: 2 ", f"Compile model: {compile_model}"]
    assert float(re.fullmatch(r"average step time: ([0-9.e-]+)", lines[-1]).group(1)) > 0


def test_readme_example_learns():
    # The README's Python example (tests/readme/readme_test.sh checks that the
    # README shows this file): 100 SGD steps from a loss of ln 10.
    out = _run("readme.py")
    loss = float(re.fullmatch(r"loss after 100 steps: ([0-9.]+)\n", out).group(1))
    assert loss < 0.1, out


def test_mlp_fashion_mnist_learns():
    out = _run("mlp_fashion_mnist.py", "--epochs", "1")
    acc = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
    assert acc > 80, out  # one epoch; three reach 87% (README)
    assert "compilations: 1 (train), 1 (predict)" in out


def test_resnet_fashion_mnist_learns(tmp_path):
    out = _run("train_resnet.py", "--epochs", "1", "--steps", "30", "--batch-size", "64", "--save",
               str(tmp_path / "resnet"))
    acc = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
    assert acc > 60, out  # 30 steps of 64: 71% (chance: 10%)
    model, params, state = __import__("kiln").models.from_pretrained(str(tmp_path / "resnet"))
    assert model.labels[0] == "T-shirt/top"
    assert state["resnet.embedder.embedder.normalization.num_batches_tracked"].item() == 30


def test_finetune(tmp_path):
    import shutil

    import kiln

    images = os.path.join(ROOT, "tests", "fixtures", "decode", "images")
    for name in sorted(os.listdir(images)):
        cls = tmp_path / "data" / name.split("_")[0]  # jpeg / png
        cls.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(images, name), cls / name)
    out = _run("finetune.py", "--model", os.path.join(ROOT, "tests", "fixtures", "vit_golden"),
               "--data", str(tmp_path / "data"), "--steps", "3", "--batch-size", "4",
               "--image-size", "48", "--out", str(tmp_path / "out"))
    assert "a new one for 2 labels (jpeg, png)" in out  # the folder's classes
    assert "position embeddings resampled" in out
    assert re.search(r"held-out accuracy [0-9.]+% \(\d+ images\)", out)
    model, params = kiln.nn.ViTForImageClassification.from_pretrained(str(tmp_path / "out"))
    assert model.config.id2label == ["jpeg", "png"] and model.config.image_size == 48


def test_finetune_gpt2(tmp_path):
    import shutil

    import kiln

    # A small GPT-2 of the fixture tokenizer's 1,200 tokens, saved as
    # transformers saves one, with its tokenizer.
    model = kiln.models.from_config({"model_type": "gpt2", "vocab_size": 1200, "n_positions": 64,
                                     "n_embd": 32, "n_layer": 2, "n_head": 2,
                                     "bos_token_id": 0, "eos_token_id": 0})
    model.save_pretrained(str(tmp_path / "gpt2"), model.init(kiln.random.key(0)))
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", "tokenizer_golden", "tokenizer.json"),
                tmp_path / "gpt2" / "tokenizer.json")
    out = _run("finetune_gpt2.py", "--model", str(tmp_path / "gpt2"), "--text",
               "/usr/share/common-licenses/GPL-2", "--steps", "60", "--batch-size", "8",
               "--seq-len", "32", "--lr", "5e-3", "--out", str(tmp_path / "out"))
    before = float(re.search(r"held-out loss ([0-9.]+) \(perplexity [0-9.]+\) before", out)[1])
    after = float(re.search(r"held-out loss ([0-9.]+) \(perplexity [0-9.]+\) after", out)[1])
    assert after < before - 0.5, out
    assert "sample: The" in out
    tuned, params, _ = kiln.models.from_pretrained(str(tmp_path / "out"))
    assert tuned.causal_lm and os.path.exists(tmp_path / "out" / "tokenizer.json")
