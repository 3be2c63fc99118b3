#!/usr/bin/env python3
"""Greedy generation with transformers' GPT2LMHeadModel.generate (KV cache
on, as its default) from a model folder: --new tokens after a prompt of
token ids, fp32 (or --precision bf16: the model in bfloat16) on the CPU; one warm-up call, then --repeats timed calls.
Prints one JSON line (tokens/s of the new tokens, median of the calls).

    python bench/lm/torch_generate.py DIR --prompt-ids 1,2,3 --new 128
"""
import argparse
import json
import statistics
import time

import torch
import transformers

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("model")
p.add_argument("--prompt-ids", required=True)
p.add_argument("--new", type=int, default=128)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
a = p.parse_args()
model = transformers.GPT2LMHeadModel.from_pretrained(a.model).eval()
if a.precision == "bf16":
    model = model.to(torch.bfloat16)
ids = torch.tensor([[int(t) for t in a.prompt_ids.split(",")]])
kw = dict(do_sample=False, max_new_tokens=a.new, min_new_tokens=a.new, eos_token_id=None,
          pad_token_id=0, attention_mask=torch.ones_like(ids))
times = []
with torch.no_grad():
    out = model.generate(ids, **kw)  # warm-up
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        times.append(time.perf_counter() - t0)
t = statistics.median(times)
print(json.dumps({"peer": "transformers generate", "precision": a.precision,
                  "torch": torch.__version__,
                  "transformers": transformers.__version__, "threads": torch.get_num_threads(),
                  "prompt": ids.shape[1], "new": a.new, "seconds": t,
                  "tokens_per_second": a.new / t, "times": times,
                  "tokens": out[0].tolist()}))
