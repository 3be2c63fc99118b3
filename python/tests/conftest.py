import numpy as np
import pytest

import kiln


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def kiln_values():
    """kiln_values(dtype): a 3x4 array in kiln's own memory, in that dtype
    (the DLPack tests hand it to numpy and PyTorch)."""
    def make(dt):
        x = kiln.arange(12, dtype=kiln.float32).reshape(3, 4) * 0.75 - 4.0
        if dt == kiln.float16:  # (kiln stores float16 but does not compute in it)
            return kiln.asarray(np.asarray(x).astype(np.float16))
        return x.astype(dt)
    return make
