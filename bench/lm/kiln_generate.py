#!/usr/bin/env python3
"""Greedy generation with kiln (kiln.models ... generate: the prompt once,
then one compiled decode step per token on the KV cache) from a model
folder: --new tokens after a prompt of token ids, fp32 (or --precision bf16:
bf16 matmuls, the weights rounded once before the calls); one warm-up call,
then --repeats timed calls of --new and of 2 x --new tokens (each call
compiles its steps: the difference of the two gives the rate of a token
once prefill and compile are paid). Prints one JSON line.

    python bench/lm/kiln_generate.py DIR --prompt-ids 1,2,3 --new 128
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
import kiln  # noqa: E402

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("model")
p.add_argument("--prompt-ids", required=True)
p.add_argument("--new", type=int, default=128)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--precision", default="fp32")
a = p.parse_args()
model, params, _ = kiln.models.from_pretrained(a.model)
# The matmul weights rounded once (bf16), as the peer's model.to(torch.bfloat16).
params = model.inference_params(params, a.precision)
ids = np.asarray([[int(t) for t in a.prompt_ids.split(",")]], np.int32)


def run(n):
    t0 = time.perf_counter()
    out = model.generate(params, ids, n, eos_token_id=-1, precision=a.precision)
    return time.perf_counter() - t0, np.asarray(out)


run(a.new)  # warm-up
t1 = [run(a.new)[0] for _ in range(a.repeats)]
t2 = [run(2 * a.new)[0] for _ in range(a.repeats)]
_, out = run(a.new)
m1, m2 = statistics.median(t1), statistics.median(t2)
print(json.dumps({"peer": "kiln generate", "precision": a.precision, "prompt": ids.shape[1],
                  "new": a.new, "seconds": m1, "tokens_per_second": a.new / m1,
                  "marginal_tokens_per_second": a.new / (m2 - m1), "times": t1,
                  "times_2x": t2, "threads": kiln.num_threads() if hasattr(kiln, "num_threads")
                  else None, "tokens": out[0].tolist()}))
