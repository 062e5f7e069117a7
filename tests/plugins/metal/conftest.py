"""The Metal backend's tests run its kernels through the CPU emulator of Metal's compute model (the library the
plugin's build compiles from the .metal sources); they skip where hetero-metal or its emulator library is absent."""

from __future__ import annotations

import numpy as np
import pytest


def emulator_missing() -> str | None:
    try:
        from hetero_metal.emulator import library_path
    except ImportError:
        return "hetero-metal is not installed (pip install ./plugins/metal)"
    if not library_path().is_file():
        return f"hetero-metal's emulator library {library_path().name} is not built (pip install ./plugins/metal)"
    return None


REASON = emulator_missing()
needs_emulator = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="session")
def queue():
    from hetero_metal.emulator import EmulatorQueue

    return EmulatorQueue(seed=1234)


@pytest.fixture
def rng():
    return np.random.default_rng(7)
