#!/usr/bin/env python3
"""Writes the golden GPT-2 fixtures that tests/nn/gpt2_golden_test.cpp checks
kiln against: small transformers GPT2LMHeadModels saved with save_pretrained,
a batch of input_ids and labels (some -100), and what PyTorch computes from
them: logits, the loss, every gradient, the losses of 5 AdamW steps, and
greedy generation (model.generate(do_sample=False)) from a prompt.

Two models: "tied" (the head shares transformer.wte.weight, gelu_new,
scale_attn_by_inverse_layer_idx) and "untied" (its own lm_head.weight, gelu,
no 1/sqrt(head_dim) scaling, an n_inner of its own).

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_gpt2_golden.py tests/fixtures/gpt2_golden
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
STEPS = 5
NEW_TOKENS = 12

VARIANTS = {
    "tied": dict(vocab_size=97, n_positions=40, n_embd=32, n_layer=2, n_head=4,
                 activation_function="gelu_new", scale_attn_by_inverse_layer_idx=True,
                 tie_word_embeddings=True),
    "untied": dict(vocab_size=61, n_positions=24, n_embd=24, n_layer=3, n_head=2, n_inner=40,
                   activation_function="gelu", scale_attn_weights=False,
                   layer_norm_epsilon=1e-6, tie_word_embeddings=False),
}


def write(out, name, kwargs, seed):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed)
    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                        eos_token_id=2, **kwargs)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():  # every weight away from its initial value (LayerNorms too)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(d, safe_serialization=True)

    v, b, t = config.vocab_size, 3, 11
    ids = torch.randint(0, v, (b, t))
    labels = ids.clone()
    labels[0, 4] = -100
    labels[1, :3] = -100
    labels[2, 7:] = -100
    save_file({"input_ids": ids, "labels": labels}, os.path.join(d, "batch.safetensors"))

    model.train()
    out_ = model(input_ids=ids, labels=labels)
    out_.loss.backward()
    expected = {"logits": out_.logits.detach(), "loss": out_.loss.detach()}
    for n, p in model.named_parameters():
        expected["grad." + n] = p.grad.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
    expected["adamw_losses"] = torch.tensor(losses, dtype=torch.float64)

    # Greedy generation by the saved (not the trained) weights.
    model = GPT2LMHeadModel.from_pretrained(d).eval()
    prompt = torch.randint(0, v, (2, 5))
    with torch.no_grad():
        gen = model.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS,
                             eos_token_id=None, pad_token_id=0, synced_gpus=False,
                             attention_mask=torch.ones_like(prompt))
    assert gen.shape == (2, 5 + NEW_TOKENS), gen.shape  # no early stop
    expected["prompt"] = prompt
    expected["generated"] = gen
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(d, "expected.safetensors"),
              metadata={"adamw": str(ADAMW), "steps": str(STEPS), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__})
    print(name, "loss", out_.loss.item(), "adamw losses", losses)
    print(name, "generated", gen.tolist())


def main(out):
    for i, (name, kwargs) in enumerate(VARIANTS.items()):
        write(out, name, kwargs, seed=i)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gpt2_golden")
