"""kiln.data (kiln's data sets, Python data sets, the threaded loader) and
kiln.train.run (its TrainConfig, callbacks, interruption)."""
import os
from pathlib import Path
import shutil
import signal
import threading

import numpy as np
import pytest

import kiln


class Numbers(kiln.data.Dataset):
    image_shape = (2, 3)

    def __init__(self, n=50):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 3), i, np.float64), i % 7


def test_a_python_dataset_in_the_threaded_loader():
    loader = kiln.data.Loader(Numbers(), batch_size=8, shuffle=True, seed=3, workers=2)
    assert len(loader) == 6  # the last partial batch dropped
    seen = []
    for batch in loader:
        assert batch.images.shape == (8, 2, 3) and batch.images.dtype == kiln.float32
        x = np.asarray(batch.images)
        assert (x == x[:, :1, :1]).all()
        np.testing.assert_array_equal(np.asarray(batch.labels), x[:, 0, 0].astype(int) % 7)
        seen += x[:, 0, 0].astype(int).tolist()
        assert batch.epoch == 0
    assert len(seen) == 48 == len(set(seen)) and seen != sorted(seen)
    again = [np.asarray(b.images)[:, 0, 0].astype(int).tolist() for b in
             kiln.data.Loader(Numbers(), batch_size=8, shuffle=True, seed=3, workers=0)]
    assert sum(again, []) == seen  # the order is (seed, epoch)'s, whatever the threads
    assert next(loader).epoch == 1  # the next epoch


def test_python_dataset_errors_reach_the_caller():
    class Broken(Numbers):
        def __getitem__(self, i):
            if i == 5:
                raise ValueError("sample 5 is broken")
            return super().__getitem__(i)

    loader = kiln.data.Loader(Broken(), batch_size=10, workers=2)
    with pytest.raises(ValueError, match="sample 5 is broken"):
        for _ in loader:
            pass
    with pytest.raises(ValueError, match="sample 5 is broken"):  # again, as often as asked
        next(loader)

    class WrongSize(Numbers):
        def __getitem__(self, i):
            return np.zeros(5, np.float32), 0

    with pytest.raises(kiln.KilnError, match=r"item 0: an image of 5 values, expected image_shape"):
        next(kiln.data.Loader(WrongSize(), batch_size=2, workers=0))


def test_loader_limit_and_close():
    loader = kiln.data.Loader(Numbers(), batch_size=5, limit=3)
    assert len(list(loader)) == 3  # the limit ends the loop
    with pytest.raises(StopIteration):
        next(loader)
    loader = kiln.data.Loader(Numbers(), batch_size=5)
    next(loader)
    loader.close()
    assert list(loader) == []


def test_kiln_datasets():
    fm = kiln.data.FashionMNIST("test")
    assert len(fm) == 10000 and fm.image_shape == (1, 28, 28)
    image, label = fm[0]
    assert label == 9 and fm.classes[label] == "Ankle boot"  # the test split's first image
    assert abs(float(np.asarray(image).mean())) < 3  # normalized
    r = kiln.data.RandomImages(num_samples=10, num_labels=4, image_size=8)
    assert r.image_shape == (3, 8, 8) and [r[i][1] for i in range(6)] == [0, 1, 2, 3, 0, 1]
    batch = next(kiln.data.Loader(r, batch_size=5))
    np.testing.assert_array_equal(np.asarray(batch.images[2]), np.asarray(r[2][0]))


def test_train_run_with_callbacks():
    steps, evals = [], []
    report = kiln.train.run(model="vit-fmnist", data="fashion-mnist", steps=4, warmup=1,
                            batch_size=16, mode="jit", optimizer="adamw", lr=1e-3, eval_every=4,
                            eval_samples=500, on_step=steps.append, on_eval=evals.append)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(np.isfinite(s["loss"]) and s["seconds"] > 0 for s in steps)
    assert len(evals) == 1 and 0 <= evals[0]["accuracy"] <= 1 and evals[0]["samples"] == 500
    assert report["compiles"] >= 1 and report["median"] > 0 and len(report["steps"]) == 4
    assert report["parameters"] > 0


def test_train_run_errors_name_the_option():
    with pytest.raises(kiln.KilnError, match="no option 'batch_sise'"):
        kiln.train.run(model="vit-tiny", batch_sise=4)
    with pytest.raises(kiln.KilnError, match="mode 'fast', expected eager, lazy or jit"):
        kiln.train.run(model="vit-tiny", mode="fast")
    with pytest.raises(kiln.KilnError, match=r"TrainConfig.batch_size = '4': expected an int"):
        kiln.train.TrainConfig(batch_size="4")
    with pytest.raises(kiln.KilnError, match=r"TrainConfig.augment = 1: expected a bool"):
        kiln.train.TrainConfig(augment=1)
    with pytest.raises(kiln.KilnError, match="unknown preset|vit-tinny"):
        kiln.train.TrainConfig(model="vit-tinny")
    # The run's own checks (train::validate), as the command's: they name the flag.
    with pytest.raises(kiln.KilnError, match="--batch-size"):
        kiln.train.run(model="vit-tiny", batch_size=0)
    with pytest.raises(kiln.KilnError, match="--epochs needs a finite data set"):
        kiln.train.run(model="vit-tiny", epochs=1)


def test_train_config_binds_the_runs_settings():
    c = kiln.train.TrainConfig(model="vit-fmnist", data="fashion-mnist", batch_size=16,
                               mode="torch_xla", crop_scale=(0.5, 1), image_size=(28, 28),
                               attention="unfused", lr=0.5, rand_augment="rand-m9-mstd0.5-inc1")
    assert (c.model, c.data, c.batch_size, c.mode, c.lr) == ("vit-fmnist", "fashion-mnist", 16,
                                                             "lazy", 0.5)
    assert c.crop_scale == (0.5, 1.0) and c.image_size == 28 and c.attention == "unfused"
    d = c.replace(steps=7, mode="jax")
    assert (d.steps, d.mode, d.batch_size) == (7, "jit", 16) and c.mode == "lazy"
    options = c.options()
    assert options["batch_size"] == 16 and options["model"] == "vit-fmnist"
    assert kiln.train.TrainConfig(**options).options() == options
    assert "batch_size=16" in repr(c)
    assert c.rand_augment == "rand-m9-n2-p0.5-mstd0.5-mmax10-inc1"
    assert c.replace(rand_augment=None).rand_augment is None


def test_train_run_from_a_config_for_an_epoch(tmp_path):
    # An image folder of vit-fmnist's 10 classes, 10 grey images each: every
    # 10th held out, 90 to train.
    images = sorted((Path(__file__).parents[2] / "examples" / "images").glob("*.png"))
    for c in range(10):
        (tmp_path / f"class{c}").mkdir()
        for i in range(10):
            shutil.copy(images[(c + i) % len(images)], tmp_path / f"class{c}" / f"{i}.png")
    steps = []
    config = kiln.train.TrainConfig(model="vit-fmnist", data=f"imagefolder:{tmp_path}",
                                    batch_size=30, mode="jit", warmup=1)
    report = kiln.train.run(config, epochs=1, on_step=steps.append)
    assert [s["step"] for s in steps] == [1, 2, 3]  # 90 images, 30 a step
    assert len(report["steps"]) == 3 and report["evals"][-1]["samples"] == 10


def test_train_run_stops_on_ctrl_c_and_on_callback_errors():
    seen = []

    def on_step(s):
        seen.append(s["step"])
        if s["step"] == 2:
            threading.Timer(0.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            threading.Event().wait(0.2)  # the signal arrives while the run goes on

    with pytest.raises(KeyboardInterrupt):
        kiln.train.run(model="vit-tiny", image_size=32, steps=50, warmup=1, batch_size=2,
                       on_step=on_step)
    assert 2 <= seen[-1] < 50

    class Stop(Exception):
        pass

    def boom(s):
        raise Stop(f"at step {s['step']}")

    with pytest.raises(Stop, match="at step 1"):
        kiln.train.run(model="vit-tiny", steps=3, warmup=1, batch_size=2, on_step=boom)
