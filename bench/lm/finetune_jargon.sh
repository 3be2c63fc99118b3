#!/usr/bin/env bash
# Fine-tuning a GPT-2 that transformers saved, on the Jargon File, with kiln.
# GPT-2's own weights are on the Hugging Face Hub, which this machine cannot
# reach; so the pretrained model is made here the way one is made anywhere:
# transformers' GPT2LMHeadModel trained from scratch with PyTorch on other
# English text (the BSD fortune(6) databases, Debian's `fortunes`: quotations,
# jokes, verse) with a byte-level BPE of its own, written with
# save_pretrained. kiln then
#   1. evaluates that folder on the Jargon File's held-out blocks (kiln eval),
#   2. fine-tunes it on the Jargon File (kiln train --init-from, its tokenizer),
#   3. trains the same model from scratch on the same tokens and steps,
# and samples the fine-tuned model. Writes OUT/ (default
# bench/results/<date>-gpt-finetune-jargon).
#   PYTHON: a Python with torch, transformers and tokenizers (default
#     bench/peers/.venv/bin/python)
#   bash bench/lm/finetune_jargon.sh [OUT] [PRETRAIN_STEPS] [STEPS]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/bench/results/$(date +%F)-gpt-finetune-jargon}"
pre_steps="${2:-1000}"
steps="${3:-300}"
py="${PYTHON:-$root/bench/peers/.venv/bin/python}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export KILN_TOKEN_CACHE="$work/cache"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
if [ ! -f /usr/share/doc/jargon-text/jargon.txt.gz ] || [ ! -f /usr/share/games/fortunes/fortunes ]; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq jargon-text fortunes
fi
zcat /usr/share/doc/jargon-text/jargon.txt.gz > "$work/jargon.txt"
# The pretraining text: every English fortune file but the pictures, the
# '%' separators as blank lines, overstriking (x BACKSPACE x) removed.
"$py" - "$work/fortunes.txt" <<'PY'
import os, re, sys
d = "/usr/share/games/fortunes"
parts = []
for name in sorted(os.listdir(d)):
    path = os.path.join(d, name)
    if name.endswith((".dat", ".u8")) or name in ("art", "ascii-art", "translate-me") or \
            not os.path.isfile(path):
        continue
    with open(path, encoding="utf-8", errors="replace") as f:
        text = re.sub(r".\x08", "", f.read())
    parts.append(re.sub(r"(?m)^%$", "", text))
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write("\n".join(parts))
PY
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD)"
  echo "fortunes: $(dpkg-query -W -f='${Version}' fortunes), jargon-text: $(dpkg-query -W -f='${Version}' jargon-text)"
  lscpu | grep -E 'Model name|^CPU\(s\)'
} > "$out/machine.txt"
"$py" "$root/bench/lm/train_bpe.py" "$work/fortunes.txt" 4096 "$work/tok" | tee "$out/tokenizer.txt"
# 1. The pretrained model: transformers + PyTorch on the fortunes.
"$py" "$root/bench/lm/torch_pretrain.py" "$root/bench/lm/jargon_config.json" "$work/fortunes.txt" \
  "$work/tok" "$work/pretrained" --steps "$pre_steps" | tee "$out/pretrain.txt"
# The Jargon File's unigram entropy under this tokenizer (a model that knows
# only each token's frequency).
"$py" - "$work/tok/tokenizer.json" "$work/jargon.txt" <<'PY' | tee "$out/jargon_unigram.txt"
import collections, math, sys
from tokenizers import Tokenizer
ids = Tokenizer.from_file(sys.argv[1]).encode(open(sys.argv[2], encoding="utf-8").read()).ids
c = collections.Counter(ids)
n = len(ids)
h = -sum(v / n * math.log(v / n) for v in c.values())
print(f"the Jargon File: {n} tokens of the fortunes' tokenizer, unigram entropy {h:.4f} nats "
      f"(perplexity {math.exp(h):.0f})")
PY
common=(--data "text:$work/jargon.txt" --seq-len 128 --batch-size 16 --steps "$steps" --warmup 2
  --optimizer adamw --weight-decay 0.1 --schedule cosine --lr-warmup 30 --clip-norm 1.0
  --eval-every 100 --mode jit --print-every 50)
# 2. kiln: the transformers-saved folder on the Jargon File before fine-tuning.
"$root/build/kiln" eval --model "$work/pretrained" --data "text:$work/jargon.txt" --seq-len 128 \
  | tee "$out/before.txt"
# 3. Fine-tuned (its tokenizer comes from the folder), and from scratch.
"$root/build/kiln" train --init-from "$work/pretrained" "${common[@]}" --lr 5e-4 \
  --save "$work/finetuned" --log-json "$out/finetune.jsonl" | tee "$out/finetune.txt"
"$root/build/kiln" train --config "$root/bench/lm/jargon_config.json" --tokenizer "$work/tok" \
  "${common[@]}" --lr 1e-3 --log-json "$out/scratch.jsonl" | tee "$out/scratch.txt"
for seed in 1 2 3; do
  "$root/build/kiln" generate --model "$work/finetuned" --prompt "hacker n. " \
    --max-new-tokens 80 --temperature 0.8 --top-k 40 --seed "$seed" --ignore-eos
  echo "----"
done > "$out/samples.txt" 2> "$out/generate.txt"
cat "$out/samples.txt"
