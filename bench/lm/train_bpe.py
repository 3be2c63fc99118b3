#!/usr/bin/env python3
"""Trains a GPT-2-style byte-level BPE tokenizer (HuggingFace tokenizers) on
a text file and writes DIR/tokenizer.json, which kiln's data::Tokenizer
reads; prints the text's token count and unigram entropy (nats per token:
the loss of a model that knows only each token's frequency).

    python bench/lm/train_bpe.py TEXT VOCAB_SIZE DIR
"""
import collections
import math
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def main(text_path, vocab_size, out):
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([text_path], trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(text_path, encoding="utf-8") as f:
        ids = tok.encode(f.read()).ids
    counts = collections.Counter(ids)
    n = len(ids)
    entropy = -sum(c / n * math.log(c / n) for c in counts.values())
    print(f"{n} tokens, vocabulary {tok.get_vocab_size()}, unigram entropy {entropy:.4f} nats")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
