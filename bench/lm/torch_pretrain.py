#!/usr/bin/env python3
"""Trains transformers' GPT2LMHeadModel from scratch on a text file with
PyTorch, as run_clm.py would (the text tokenized whole, packed into blocks
of --seq-len, the last 10% of blocks held out; AdamW, linear warm-up then
cosine decay, gradient clipping, the config's dropout), then writes OUT with
save_pretrained and the tokenizer beside it: a GPT-2 folder that transformers
saved, for kiln to load and fine-tune. Prints the held-out loss.

    python bench/lm/torch_pretrain.py CONFIG TEXT TOKENIZER_DIR OUT --steps 800
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
import transformers
from tokenizers import Tokenizer

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("config")
p.add_argument("text")
p.add_argument("tokenizer")
p.add_argument("out")
p.add_argument("--steps", type=int, default=800)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--seq-len", type=int, default=128)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--warmup", type=int, default=100)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

torch.manual_seed(a.seed)
tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
with open(a.text, encoding="utf-8") as f:
    ids = tok.encode(f.read()).ids
eos = tok.token_to_id("<|endoftext|>")
if eos is not None:
    ids.append(eos)
blocks = torch.tensor(ids[: len(ids) // a.seq_len * a.seq_len]).view(-1, a.seq_len)
held = max(1, len(blocks) // 10)
train, val = blocks[:-held], blocks[-held:]
with open(a.config) as f:
    config = transformers.GPT2Config(**{k: v for k, v in json.load(f).items()
                                        if k not in ("model_type", "architectures")})
model = transformers.GPT2LMHeadModel(config)
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
rest = [p for n, p in model.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": rest, "weight_decay": 0.0}], lr=a.lr)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: (s + 1) / a.warmup if s < a.warmup else
    0.5 * (1 + math.cos(math.pi * (s - a.warmup) / max(1, a.steps - a.warmup))))
print(f"{len(ids)} tokens, {len(train)} training and {len(val)} held-out blocks of {a.seq_len}; "
      f"{sum(p.numel() for p in model.parameters())} parameters; torch {torch.__version__}, "
      f"transformers {transformers.__version__}, {torch.get_num_threads()} threads", flush=True)


def held_out_loss():
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(val), a.batch_size):
            b = val[i:i + a.batch_size]
            total += model(b, labels=b).loss.item() * len(b)
            n += len(b)
    model.train()
    return total / n


g = torch.Generator().manual_seed(a.seed)
t0 = time.time()
model.train()
for step in range(1, a.steps + 1):
    batch = train[torch.randint(len(train), (a.batch_size,), generator=g)]
    loss = model(batch, labels=batch).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    if step % 100 == 0 or step == 1:
        print(f"step {step}/{a.steps}  loss {loss.item():.4f}  {time.time() - t0:.0f} s", flush=True)
print(f"held-out loss {held_out_loss():.4f} after {a.steps} steps, {time.time() - t0:.0f} s")
model.save_pretrained(a.out)
shutil.copy(os.path.join(a.tokenizer, "tokenizer.json"), os.path.join(a.out, "tokenizer.json"))
print(f"saved {a.out}: {sorted(os.listdir(a.out))}")
