#!/usr/bin/env python3
"""Writes the golden byte-level BPE fixtures that tests/data/tokenizer_test.cpp
checks kiln's tokenizer against: a GPT-2-style tokenizer (HuggingFace
tokenizers' ByteLevel pre-tokenizer, BPE model and decoder, <|endoftext|> as
an added special token) trained on the text of the GNU GPL version 3 as
Debian ships it (/usr/share/common-licenses/GPL-3, package base-files), saved
both as tokenizer.json and as vocab.json + merges.txt, and the ids that
tokenizers gives for the text of the GNU GPL version 2
(/usr/share/common-licenses/GPL-2: real English prose, never seen in
training) and for a list of hard cases (contractions, digits, runs of
spaces and newlines, accents, CJK, emoji, the special token inside text).
The texts are stored beside their ids, so that the test reads no system
file. (GPT-2's own vocabulary is on the Hub, which this machine cannot
reach: the test checks the algorithm and the file formats, which are
GPT-2's.)

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_tokenizer_golden.py tests/fixtures
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HARD_CASES = [
    "",
    "Hello world",
    " Hello  world ",
    "I'm sure you'll see they've said it's the user's THEIR'S",
    "1234567 apples, 3.14159 and -42",
    "tabs\tand\nnewlines\n\n\nand   trailing   ",
    "   leading spaces",
    "naïve café résumé – “quoted” — ‘single’",
    "日本語のテキストと中文",
    "emoji 🤗🚀 and symbols ©®™ €100",
    "text<|endoftext|>more text <|endoftext|>",
    "<|endoftext|>",
    "a\u00a0non-breaking\u2003em space",
    "CAPITALS and MiXeD cAsE",
    "x" * 300,
    "\n",
]


def main(out_root: str) -> None:
    out = os.path.join(out_root, "tokenizer_golden")
    os.makedirs(out, exist_ok=True)
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        train_text = f.read()
    with open("/usr/share/common-licenses/GPL-2", encoding="utf-8") as f:
        test_text = f.read()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train_text.split("\n\n"), trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    tok.model.save(out)  # vocab.json and merges.txt

    cases = [{"name": "GPL-2 (/usr/share/common-licenses/GPL-2)", "text": test_text}]
    cases += [{"name": f"hard case {i}", "text": t} for i, t in enumerate(HARD_CASES)]
    for c in cases:
        enc = tok.encode(c["text"])
        c["ids"] = enc.ids
        c["decoded"] = tok.decode(enc.ids, skip_special_tokens=False)
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"vocab_size": tok.get_vocab_size(), "cases": cases}, f, ensure_ascii=False,
                  indent=0)
    print(f"{out}: vocab {tok.get_vocab_size()}, GPL-2 as {len(cases[0]['ids'])} tokens")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
