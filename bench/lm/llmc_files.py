#!/usr/bin/env python3
"""Writes what llm.c's CPU trainer (train_gpt2.c) reads, for a GPT-2 124M
drawn by kiln: OUT/gpt2_124M.bin (llm.c's checkpoint format, version 3: a
header of 256 int32, then the parameters in f32 in its order, the Conv1D
weights transposed to its [out, in], wte padded to 50304 rows), random
tokens as its .bin files (OUT/dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin),
and the same model as a folder kiln reads (OUT/kiln_gpt2, save_pretrained).

    python bench/lm/llmc_files.py OUT
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
import kiln  # noqa: E402

out = sys.argv[1]
with open(os.path.join(os.path.dirname(__file__), "gpt2_124m.json")) as f:
    cfg = json.load(f)
model = kiln.models.from_config(cfg)
params = {k: np.asarray(v) for k, v in model.init(kiln.random.key(0)).items()}
model.save_pretrained(os.path.join(out, "kiln_gpt2"), {k: kiln.asarray(v) for k, v in params.items()})
L, C, V, T, Vp = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], 50304
header = np.zeros(256, np.int32)
header[:8] = [20240326, 3, T, V, L, cfg["n_head"], C, Vp]
h = "transformer.h.{}."


def layers(name, transpose=False):
    return np.stack([params[h.format(i) + name].T if transpose else params[h.format(i) + name]
                     for i in range(L)])


wte = np.zeros((Vp, C), np.float32)
wte[:V] = params["transformer.wte.weight"]
tensors = [wte, params["transformer.wpe.weight"], layers("ln_1.weight"), layers("ln_1.bias"),
           layers("attn.c_attn.weight", True), layers("attn.c_attn.bias"),
           layers("attn.c_proj.weight", True), layers("attn.c_proj.bias"),
           layers("ln_2.weight"), layers("ln_2.bias"), layers("mlp.c_fc.weight", True),
           layers("mlp.c_fc.bias"), layers("mlp.c_proj.weight", True), layers("mlp.c_proj.bias"),
           params["transformer.ln_f.weight"], params["transformer.ln_f.bias"]]
with open(os.path.join(out, "gpt2_124M.bin"), "wb") as f:
    f.write(header.tobytes())
    for t in tensors:
        f.write(np.ascontiguousarray(t, np.float32).tobytes())
data = os.path.join(out, "dev", "data", "tinyshakespeare")
os.makedirs(data, exist_ok=True)
rng = np.random.default_rng(0)
for split, n in (("train", 65536), ("val", 16384)):
    head = np.zeros(256, np.int32)
    head[:3] = [20240520, 1, n]
    with open(os.path.join(data, f"tiny_shakespeare_{split}.bin"), "wb") as f:
        f.write(head.tobytes())
        f.write(rng.integers(0, V, n).astype(np.uint16).tobytes())
print("wrote", out)
