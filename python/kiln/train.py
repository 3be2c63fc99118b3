"""``kiln train`` from Python: the same run, flags and checks as the
command line, with Python callbacks.

    report = kiln.train.run(model="vit-tiny", data="fashion-mnist", steps=100,
                            batch_size=64, mode="jit",
                            on_step=lambda s: print(s["step"], s["loss"]))
"""
from __future__ import annotations

from typing import Any, Callable

from . import _kiln

__all__ = ["run", "flags_of"]


def flags_of(**options: Any) -> list[str]:
    """The command line's flags for keyword options: ``batch_size=32`` is
    ``--batch-size 32``; True is the flag alone, False and None leave it
    out; a list or tuple is joined with commas (``crop_scale=(0.5, 1)``)."""
    out = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def run(on_step: Callable[[dict], Any] | None = None, on_eval: Callable[[dict], Any] | None = None,
        on_save: Callable[[tuple], Any] | None = None, **options: Any) -> dict:
    """Runs ``kiln train`` with ``options`` (its flags as keywords, see
    ``kiln train --help``). ``on_step(dict)`` is called after every step
    (step, seconds, data_seconds, loss, lr), ``on_eval(dict)`` after each
    evaluation (loss, accuracy, top5, ...), ``on_save((step, dir))`` after
    each checkpoint. Returns the report: step-time statistics (mean, median,
    p90 in seconds), images_per_second, compile_ms, evals, steps, ...
    Ctrl-C stops the run after the step under way (KeyboardInterrupt); an
    exception raised in a callback stops it and reaches the caller."""
    return _kiln._train_run(flags_of(**options), on_step, on_eval, on_save)
