"""One Session shared by threads gives exactly what sequential runs give (runs take turns on the session's lock);
two sessions run side by side; a kernel that raises mid-run leaves the session usable."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import hetero
from concurrency import run_in_threads
from conftest import backend_ok
from hetero.contract.errors import BackendError
from hetero.demo import tiny_cnn
from hetero.runtime.executor import KernelProgram

# Every installed backend, judged when its test runs: the conftest's session-wide HETERO_CACHE_DIR (set after
# collection) moves the toolkit environments some backends probe for, so a backend ok at import may not be then.
INSTALLED = [row.name for row in hetero.backends()]


def _images(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    # batches of different sizes: each run changes the shapes the kernels were prepared for
    return [rng.normal(size=(1 + i % 3, 3, 32, 32)).astype(np.float32) for i in range(count)]


@pytest.mark.parametrize("backend", INSTALLED)
def test_one_session_from_threads_matches_sequential_runs_bit_for_bit(backend):
    ok, why = backend_ok(backend)
    if not ok:
        pytest.skip(why)
    session = hetero.Session(tiny_cnn(), backends=[backend], on_fallback="silent")
    images = _images(6)
    want = [session.run({"image": x})["probs"] for x in images]

    def work(i: int) -> list[np.ndarray]:
        return [session.run({"image": images[(i + k) % len(images)]})["probs"] for k in range(4)]

    for i, outs in enumerate(run_in_threads(work, 4)):
        for k, got in enumerate(outs):
            np.testing.assert_array_equal(got, want[(i + k) % len(images)])


@pytest.mark.skipif(importlib.util.find_spec("magika") is None, reason="magika is not installed (pip install magika)")
def test_magika_from_threads_matches_sequential_runs_bit_for_bit():
    import magika

    model = Path(magika.__file__).parent / "models" / "standard_v3_3" / "model.onnx"
    if not model.is_file():
        pytest.skip(f"this magika has no {model.name} at {model.parent}")
    session = hetero.Session(str(model), backends=["cpu"], on_fallback="silent")
    name = session.input_names[0]
    rng = np.random.default_rng(0)
    feeds = [{name: rng.integers(0, 257, size=(1, 2048)).astype(np.int32)} for _ in range(4)]
    want = [session.run(f) for f in feeds]

    def work(i: int) -> list[dict[str, np.ndarray]]:
        return [session.run(feeds[(i + k) % len(feeds)]) for k in range(3)]

    for i, outs in enumerate(run_in_threads(work, 4)):
        for k, got in enumerate(outs):
            expected = want[(i + k) % len(feeds)]
            for out in expected:
                np.testing.assert_array_equal(got[out], expected[out])


def test_two_sessions_in_two_threads_give_what_each_gives_alone():
    sessions = [hetero.Session(tiny_cnn(seed=s), backends=["cpu"], on_fallback="silent") for s in (1, 2)]
    images = _images(4)
    alone = [[s.run({"image": x})["probs"] for x in images] for s in sessions]
    together = run_in_threads(lambda i: [sessions[i].run({"image": x})["probs"] for x in images * 2], 2)
    for i in (0, 1):
        for k, got in enumerate(together[i]):
            np.testing.assert_array_equal(got, alone[i][k % len(images)])


def test_a_kernel_raising_mid_run_names_op_and_backend_and_leaves_the_session_usable():
    session = hetero.Session(tiny_cnn(), backends=["cpu"], on_fallback="silent")
    image = _images(1)[0]
    want = session.run({"image": image})["probs"]
    session.run({"image": image})  # recorded into the replay: the failure must also drop that
    step = next(s for p in session.programs if isinstance(p, KernelProgram) for s in p.steps
                if s.node.op_type == "MaxPool")
    real_run = step.kernel.run

    def failing(*args, **kwargs):
        raise RuntimeError("device lost")  # what a driver or a native kernel raises

    step.kernel.run = failing  # type: ignore[method-assign]  # a kernel whose device fails mid-run
    session.invalidate_replay()  # the replay calls bound kernels directly; the interpreter path calls run()
    with pytest.raises(BackendError, match=r"cpu: MaxPool node .pool1.: RuntimeError: device lost"):
        session.run({"image": image})
    step.kernel.run = real_run  # type: ignore[method-assign]  # and works again
    for _ in range(3):  # interpreted, planned and replayed runs all give the answer again
        np.testing.assert_array_equal(session.run({"image": image})["probs"], want)


def test_a_kernel_raising_in_a_replayed_run_is_named_too_and_the_session_recovers():
    session = hetero.Session(tiny_cnn(), backends=["cpu"], on_fallback="silent")
    step = next(s for p in session.programs if isinstance(p, KernelProgram) for s in p.steps
                if s.node.op_type == "MaxPool")
    real_run = step.kernel.run
    calls: list[int] = []
    broken = False

    def run(*args, **kwargs):
        if broken:
            calls.append(1)
            raise RuntimeError("device lost")  # what a driver or a native kernel raises
        return real_run(*args, **kwargs)

    step.kernel.run = run  # type: ignore[method-assign]  # a kernel that fails when told to
    step.kernel.bind = lambda inputs, outputs: None  # type: ignore[method-assign]  # the replay calls run itself
    session.invalidate_replay()
    image = _images(1)[0]
    want = session.run({"image": image})["probs"]
    for _ in range(3):  # interpreted, planned, then replayed
        session.run({"image": image})
    broken = True
    with pytest.raises(BackendError, match=r"cpu: MaxPool node .pool1.: RuntimeError: device lost"):
        session.run({"image": image})
    assert len(calls) == 2  # the replayed call, then the interpreted run that names the node
    broken = False
    for _ in range(3):
        np.testing.assert_array_equal(session.run({"image": image})["probs"], want)
