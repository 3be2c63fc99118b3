"""Loads folders that kiln's io::save_pretrained wrote with transformers'
AutoModelForImageClassification and reports what from_pretrained found
missing, unexpected or mismatched (nothing, when kiln writes them right).

usage: python check_model_folders.py DIR [DIR ...]
"""
import sys

import transformers


def main(dirs):
    print("transformers", transformers.__version__)
    failed = 0
    for path in dirs:
        model, info = transformers.AutoModelForImageClassification.from_pretrained(
            path, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v}
        failed += bool(problems)
        print(path, type(model).__name__, "num_labels", model.config.num_labels,
              "problems:", problems or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
