"""hetero.contract.vendor_worker: calls with arrays, state kept between calls, and a worker that aborts or hangs
turned into a BackendError naming what was being done (the test process lives on)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import BackendError, BackendUnavailable
from hetero.contract.vendor_worker import VendorEnv, VendorWorker, WorkerCrashed, WorkerTimeout, decode, encode

HANDLERS = Path(__file__).parent / "vendor_worker" / "selftest_handlers.py"


@pytest.fixture
def worker():
    w = VendorWorker(sys.executable, HANDLERS, name="selftest", start_timeout=60)
    yield w
    w.close()


def test_messages_carry_arrays_of_every_plain_dtype():
    kinds = ("float32", "float16", "int8", "uint8", "int64", "bool")
    arrays = [(np.arange(6) % 3).astype(d).reshape(2, 3) for d in kinds]
    back = decode(encode({"a": arrays, "n": 3, "s": "x", "none": None})[8:])
    assert back["n"] == 3 and back["s"] == "x" and back["none"] is None
    for sent, got in zip(arrays, back["a"], strict=True):
        assert got.dtype == sent.dtype and np.array_equal(got, sent)


def test_calls_keep_state_and_survive_stdout_noise(worker):
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert worker.call("remember", context="storing x", name="x", array=x) == {"shape": [3, 4], "dtype": "float32"}
    out = worker.call("scaled", context="scaling x", name="x", factor=2.0)
    np.testing.assert_array_equal(out["value"], x * 2)
    assert out["pid"] == worker.pid and worker.starts == 1


def test_handler_exception_is_a_backend_error_and_the_worker_lives(worker):
    worker.call("remember", context="storing x", name="x", array=np.ones(2))
    with pytest.raises(BackendError, match="selftest worker, checking the input: ValueError: bad input"):
        worker.call("fail", context="checking the input", message="bad input")
    assert worker.call("scaled", context="after the error", name="x", factor=1.0)["pid"] == worker.pid


def test_abort_becomes_worker_crashed_naming_the_context_and_the_next_call_restarts(worker):
    worker.call("remember", context="storing x", name="x", array=np.ones(2))
    with pytest.raises(WorkerCrashed) as info:
        worker.call("abort", context="building segment 2 for rk2118")
    message = str(info.value)
    assert "killed by SIGABRT" in message and "building segment 2 for rk2118" in message
    assert "fatal error in the graph optimizer" in message  # the worker's last output
    assert not worker.alive
    # a fresh worker: the state of the dead one is gone, which the handler reports as a KeyError
    with pytest.raises(BackendError, match="KeyError"):
        worker.call("scaled", context="after the crash", name="x", factor=1.0)
    assert worker.starts == 2


def test_timeout_stops_the_worker(worker):
    with pytest.raises(WorkerTimeout, match=r"did not finish compiling within 0\.5 s"):
        worker.call("sleep", context="compiling", timeout=0.5, seconds=30)
    assert not worker.alive


def test_missing_environment_names_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_SELFTEST_VENV", str(tmp_path / "nowhere"))
    env = VendorEnv("selftest", env_var="HETERO_SELFTEST_VENV", setup_command="python -m selftest setup",
                    install_steps=[], check_code="print(1)")
    with pytest.raises(BackendUnavailable) as info:
        env.check()
    assert "no selftest toolkit environment at" in info.value.message
    assert "python -m selftest setup" in info.value.hint


def test_broken_environment_says_what_fails(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("HETERO_SELFTEST_VENV", str(venv))
    env = VendorEnv("selftest", env_var="HETERO_SELFTEST_VENV", setup_command="python -m selftest setup",
                    install_steps=[], check_code="import selftest_toolkit_that_is_not_there")
    with pytest.raises(BackendUnavailable, match="is not usable: ModuleNotFoundError"):
        env.check()


def test_create_builds_the_venv_step_by_step_and_names_a_failing_step(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_SELFTEST_VENV", str(tmp_path / "venv"))
    lines: list[str] = []
    env = VendorEnv("selftest", env_var="HETERO_SELFTEST_VENV", setup_command="python -m selftest setup",
                    install_steps=[["--no-index", "hetero-selftest-package-that-is-nowhere"]],
                    check_code="import sys; print(sys.version_info.major)")
    with pytest.raises(BackendError) as info:
        env.create(report=lines.append)
    assert lines[0] == f"[1/2] creating the selftest toolkit environment {tmp_path / 'venv'} with {sys.executable}"
    assert lines[1] == "[2/2] pip install --no-index hetero-selftest-package-that-is-nowhere"
    assert "No matching distribution found for hetero-selftest-package-that-is-nowhere" in info.value.message
    assert info.value.hint == "fix the cause, then run python -m selftest setup again"
    # the venv itself was made: without the failing step the environment is ready and checks
    env.install_steps = []
    lines.clear()
    env.create(report=lines.append)
    assert lines == [f"[1/1] using the existing environment {tmp_path / 'venv'}",
                     f"selftest toolkit 3 ready in {tmp_path / 'venv'}"]
    assert env.check() == "3"
