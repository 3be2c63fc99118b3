#!/usr/bin/env bash
# A small GPT trained from scratch on the Jargon File 4.4.7 (public domain;
# Debian's jargon-text package ships it as /usr/share/doc/jargon-text/jargon.txt.gz)
# with kiln train, then sampled with kiln generate. Writes OUT/ (default
# bench/results/<date>-gpt-jargon): the tokenizer's summary, the run's log,
# its held-out loss and perplexity, and samples.
#
#   bash bench/lm/jargon.sh [OUT] [STEPS]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/bench/results/$(date +%F)-gpt-jargon}"
steps="${2:-1500}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
if [ ! -f /usr/share/doc/jargon-text/jargon.txt.gz ]; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq jargon-text
fi
mkdir -p "$work/text"
zcat /usr/share/doc/jargon-text/jargon.txt.gz > "$work/text/jargon.txt"
# The tokenizer: byte-level BPE of 4,096 tokens trained on the text
# (tokenizers from PyPI, in a venv of its own).
if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q "tokenizers==0.20.3"
fi
"$work/venv/bin/python" "$root/bench/lm/train_bpe.py" "$work/text/jargon.txt" 4096 "$work/tok" \
  | tee "$out/tokenizer.txt"
cp "$work/tok/tokenizer.json" "$out/tokenizer.json"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD)"
  lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | sed 's/Flags:.*\(avx512_bf16\|amx\).*/Flags: (AVX-512, AVX512-BF16, AMX)/'
} > "$out/machine.txt"
"$root/build/kiln" train --config "$root/bench/lm/jargon_config.json" \
  --data "text:$work/text/jargon.txt" --tokenizer "$work/tok" --seq-len 128 \
  --batch-size 16 --steps "$steps" --warmup 2 --optimizer adamw --lr 1e-3 --weight-decay 0.1 \
  --schedule cosine --lr-warmup 100 --clip-norm 1.0 --eval-every 250 --mode jit \
  --save "$work/model" --log-json "$out/train.jsonl" --print-every 50 | tee "$out/train.txt"
for seed in 1 2 3; do
  "$root/build/kiln" generate --model "$work/model" --prompt "hacker n. " --max-new-tokens 80 \
    --temperature 0.8 --top-k 40 --seed "$seed" --ignore-eos
  echo "----"
done > "$out/samples.txt" 2> "$out/generate.txt"
"$root/build/kiln" generate --model "$work/model" --prompt "The Jargon File is" \
  --max-new-tokens 60 --ignore-eos >> "$out/samples.txt" 2>> "$out/generate.txt"
cat "$out/samples.txt"
