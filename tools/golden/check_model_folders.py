"""Loads folders that kiln's io::save_pretrained wrote with transformers'
AutoModelForImageClassification (AutoModelForCausalLM for a GPT-2) and reports what from_pretrained found
missing, unexpected or mismatched (nothing, when kiln writes them right).

usage: python check_model_folders.py DIR [DIR ...]
"""
import json
import os
import sys

import transformers


def main(dirs):
    print("transformers", transformers.__version__)
    failed = 0
    for path in dirs:
        with open(os.path.join(path, "config.json")) as f:
            lm = json.load(f).get("model_type") == "gpt2"
        auto = (transformers.AutoModelForCausalLM if lm
                else transformers.AutoModelForImageClassification)
        model, info = auto.from_pretrained(path, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v}
        failed += bool(problems)
        print(path, type(model).__name__,
              "vocab_size" if lm else "num_labels",
              model.config.vocab_size if lm else model.config.num_labels,
              "problems:", problems or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
