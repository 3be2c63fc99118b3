"""Fine-tune GPT-2 on a text file: the model and its tokenizer from a folder
that transformers saved (or a Hub id in the local cache), the text cut into
blocks of --seq-len tokens (the last 10% held out), AdamW with warm-up and
cosine decay in one jitted step; the held-out loss and perplexity before and
after, a sample, and the model saved for transformers' from_pretrained and
for `kiln generate`.

    python examples/finetune_gpt2.py --model gpt2 --text notes.txt --steps 200 --out tuned
"""
import argparse
import math
import os
import shutil

import numpy as np

import kiln

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="a folder that transformers saved, or a Hub id")
p.add_argument("--text", required=True, help="a UTF-8 text file")
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--seq-len", type=int, default=256)
p.add_argument("--lr", type=float, default=1e-4)
p.add_argument("--prompt", default="The")
p.add_argument("--out", required=True)
a = p.parse_args()

model, params, _ = kiln.models.from_pretrained(a.model)
folder = kiln.models.model_folder(a.model)
tok = kiln.data.Tokenizer.from_folder(folder)
with open(a.text, encoding="utf-8") as f:
    ids = tok.encode(f.read())
eos = tok.token_id("<|endoftext|>")
if eos is not None:
    ids.append(eos)
T = min(a.seq_len, model.config["n_positions"])
blocks = np.asarray(ids[: len(ids) // T * T], np.int32).reshape(-1, T)
held = max(1, len(blocks) // 10)
if len(blocks) - held < 1:
    raise SystemExit(f"{a.text}: {len(ids)} tokens, too few for two blocks of {T}")
train, holdout = blocks[:-held], blocks[-held:]
print(f"{a.text}: {len(ids)} tokens, {len(train)} blocks of {T} to train on, {held} held out")

schedule = kiln.optim.Schedule("cosine", warmup=max(1, a.steps // 10), total=a.steps)
opt = kiln.optim.AdamW(lr=a.lr, weight_decay=0.01, schedule=schedule)
state = opt.init(params)


@kiln.jit(donate_argnums=(0, 1))
def step(params, state, x, key):
    def loss_of(p):
        logits, _ = model.apply(p, {}, x, train=True, key=key)  # GPT-2's dropout on
        return model.loss(logits, x)  # the labels are the tokens: shifted inside
    loss, grads = kiln.value_and_grad(loss_of)(params)
    params, state = opt.update(grads, state, params)
    return params, state, loss


@kiln.jit
def held_out_loss(params, x):
    logits, _ = model.apply(params, {}, x)
    return model.loss(logits, x)


def evaluate(params):
    losses = [held_out_loss(params, kiln.asarray(holdout[i:i + 1])).item()
              for i in range(len(holdout))]
    return float(np.mean(losses))


before = evaluate(params)
print(f"held-out loss {before:.4f} (perplexity {math.exp(before):.2f}) before")
rng = np.random.default_rng(0)
for i in range(1, a.steps + 1):
    x = kiln.asarray(train[rng.integers(0, len(train), a.batch_size)])
    key = kiln.random.key_data(kiln.random.Key(i))
    params, state, loss = step(params, state, x, key)
    if i % max(1, a.steps // 10) == 0 or i == a.steps:
        print(f"step {i}: loss {loss.item():.4f}")
after = evaluate(params)
print(f"held-out loss {after:.4f} (perplexity {math.exp(after):.2f}) after {a.steps} steps")
sample = model.generate(params, tok.encode(a.prompt), max_new_tokens=40, temperature=0.8,
                        top_k=40, seed=1)
print("sample:", tok.decode(sample))
model.save_pretrained(a.out, params)
for name in ("tokenizer.json", "vocab.json", "merges.txt"):
    if os.path.exists(os.path.join(folder, name)):
        shutil.copy(os.path.join(folder, name), os.path.join(a.out, name))
