"""A small convolution does not wake a sleeping pool worker (waking one costs more than the work), a large one does,
and which of the two ran it changes no bit of the result."""

from __future__ import annotations

import time

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)
from onnx import TensorProto, helper  # noqa: E402

import hetero  # noqa: E402
from conftest import make_model  # noqa: E402


def _conv(channels: int, size: int):
    rng = np.random.default_rng(channels)
    w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [("x", TensorProto.FLOAT, [1, channels, size, size])], [("y", TensorProto.FLOAT, None)],
                       [("w", w)])
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    return model, {"x": x}


@pytest.mark.parametrize("channels, size, wakes", [(16, 16, False), (64, 32, True)])  # 1.2 / 75 MFLOP
def test_a_worker_is_woken_only_for_enough_work(pool, channels, size, wakes):
    _native.set_pool_spin_us(0)  # workers sleep as soon as a call ends (the fixture restores the spin)
    model, feeds = _conv(channels, size)
    alone = hetero.Session(model, backends=["cpu"], threads=1).run(feeds)["y"]
    session = hetero.Session(model, backends=["cpu"], threads=2)
    session.run(feeds)
    time.sleep(0.05)  # let the worker fall asleep
    _native.pool_stats(True)
    out = session.run(feeds)["y"]
    stats = _native.pool_stats(True)
    assert (stats["calls"] >= 1) == wakes, stats
    assert np.array_equal(out, alone)
