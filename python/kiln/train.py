"""Training runs from Python: ``kiln train``'s run over a ``TrainConfig``,
with Python callbacks::

    config = kiln.train.TrainConfig(model="vit-tiny", data="fashion-mnist", steps=100,
                                    batch_size=64, mode="jit")
    report = kiln.train.run(config, on_step=lambda s: print(s["step"], s["loss"]))
    report = kiln.train.run(model="vit-tiny", data="fashion-mnist", steps=100)  # the same

A TrainConfig binds the C++ ``kiln::train::TrainConfig``: its options are
``kiln train``'s flags with underscores (``batch_size`` is ``--batch-size``),
and a run goes through the same set-up and checks as the command's.
"""
from __future__ import annotations

from typing import Any, Callable

from . import _kiln

TrainConfig = _kiln.TrainConfig

__all__ = ["TrainConfig", "run"]


def run(config: TrainConfig | None = None, *, epochs: int = 0, threads: int = 0,
        on_step: Callable[[dict], Any] | None = None,
        on_eval: Callable[[dict], Any] | None = None,
        on_save: Callable[[tuple], Any] | None = None, **options: Any) -> dict:
    """Trains as ``kiln train`` does: ``config`` (a TrainConfig) with
    ``options`` changed, or ``TrainConfig(**options)``. ``epochs`` passes
    over the training split set the steps (a finite data set; not with
    ``steps``); ``threads`` sets kiln's threads first. ``on_step(dict)`` is
    called after every step (step, seconds, data_seconds, loss, lr),
    ``on_eval(dict)`` after each evaluation (loss, accuracy, top5, ...),
    ``on_save((step, dir))`` after each checkpoint. Returns the report:
    step-time statistics (mean, median, p90 in seconds), images_per_second,
    compile_ms, evals, steps, ... Ctrl-C stops the run after the step under
    way (KeyboardInterrupt); an exception raised in a callback stops it and
    reaches the caller."""
    if config is None:
        config = TrainConfig(**options)
    elif options:
        config = config.replace(**options)
    if epochs and "steps" in options:
        raise _kiln.KilnError("[train] epochs and steps both set the length of the run; give one")
    return _kiln._train_run(config, epochs, threads, on_step, on_eval, on_save)
