"""What a user sees when the QNN toolkit is missing, mismatched or crashing: a status line with the reason and the
fix, never a broken ``import hetero``; and a QNN worker that dies mid-session is an error, then a fresh worker."""

from __future__ import annotations

import array
import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
import venv
from pathlib import Path

import numpy as np
import pytest

import hetero
from hetero import plugins
from hetero.contract import BackendError, BackendUnavailable


def bare_venv(root: Path, packages: dict[str, str]) -> Path:
    """A real venv (no pip) whose site-packages holds the given files: a stand-in vendor install."""
    venv.create(root, with_pip=False)
    site = next(root.glob("lib/python*/site-packages"))
    for relative, text in packages.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)
    return root


def status_with(monkeypatch, venv_path: Path):
    monkeypatch.setenv("HETERO_QNN_VENV", str(venv_path))
    plugins.reload()
    return plugins.status("hexagon")


def test_no_toolkit_environment(hexagon_site, monkeypatch, tmp_path):
    row = status_with(monkeypatch, tmp_path / "absent")
    assert row.status == "unavailable"
    assert f"no qnn toolkit environment at {tmp_path / 'absent'} (HETERO_QNN_VENV)" in row.reason
    assert "python -m hetero_hexagon setup" in row.hint
    with pytest.raises(BackendUnavailable, match="no qnn toolkit environment"):
        hetero.Session(_relu_model(), backends=["hexagon"])


def test_toolkit_package_missing_from_the_environment(hexagon_site, monkeypatch, tmp_path):
    row = status_with(monkeypatch, bare_venv(tmp_path / "venv", {}))
    assert row.status == "unavailable"
    assert "is not usable: ModuleNotFoundError: No module named 'onnxruntime'" in row.reason
    assert "python -m hetero_hexagon setup --force" in row.hint


def test_toolkit_of_another_version(hexagon_site, monkeypatch, tmp_path):
    metadata = "Metadata-Version: 2.1\nName: onnxruntime-qnn\nVersion: 9.1.0\n"
    packages = {"onnxruntime/__init__.py": "", "onnxruntime_qnn/__init__.py": "",
                "onnxruntime_qnn-9.1.0.dist-info/METADATA": metadata}
    row = status_with(monkeypatch, bare_venv(tmp_path / "venv", packages))
    assert row.status == "unavailable"
    assert "onnxruntime-qnn 9.1.0 in" in row.reason and "verified with 2.7.0" in row.reason


def test_toolkit_that_crashes_on_import(hexagon_site, monkeypatch, tmp_path):
    packages = {"onnxruntime/__init__.py": "import os\nos.abort()\n"}
    venv_path = bare_venv(tmp_path / "venv", packages)
    row = status_with(monkeypatch, venv_path)
    assert row.status == "unavailable" and "killed by SIGABRT" in row.reason
    # and in a fresh process: import hetero and the status table both work
    env = {**os.environ, "HETERO_QNN_VENV": str(venv_path)}
    code = "import hetero; r = hetero.plugins.status('hexagon'); print(r.status if r else 'absent')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("unavailable", "absent")  # absent where hetero-hexagon is not installed


def test_a_worker_that_dies_is_an_error_then_a_new_worker(hexagon):
    from hetero_hexagon.qnn import QnnRuntime

    session = hetero.Session(_relu_model(), backends=["hexagon"], on_fallback="error")
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(session.run({"x": x})["y"], np.maximum(x, 0), atol=1e-3)
    worker = QnnRuntime.shared().worker
    pid = worker.pid
    # The worker faults in the middle of a call, as a vendor library would: stopped, sent the request, then
    # SIGSEGV is delivered when it resumes.
    os.kill(pid, signal.SIGSTOP)
    outcome: list[BaseException] = []
    call = threading.Thread(target=lambda: _capture(outcome, session.run, {"x": x}))
    call.start()
    _wait_for_request(worker.proc.stdin.fileno())
    os.kill(pid, signal.SIGSEGV)
    os.kill(pid, signal.SIGCONT)
    call.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], BackendError), outcome
    assert "the qnn worker died (killed by SIGSEGV) while running segment 0" in str(outcome[0])
    assert "the process using hetero is unharmed" in str(outcome[0])
    np.testing.assert_allclose(session.run({"x": x})["y"], np.maximum(x, 0), atol=1e-3)  # a new worker, cached context


def _wait_for_request(pipe: int, timeout: float = 60.0) -> None:
    """Until the request sits in the stopped worker's input pipe (FIONREAD counts the bytes a pipe holds)."""
    deadline = time.monotonic() + timeout
    pending = array.array("i", [0])
    while time.monotonic() < deadline:
        fcntl.ioctl(pipe, termios.FIONREAD, pending)
        if pending[0] > 0:
            return
        time.sleep(0.05)
    raise AssertionError("the request never reached the worker's pipe")


def _capture(outcome: list[BaseException], function, *args) -> None:
    try:
        function(*args)
    except BaseException as exc:
        outcome.append(exc)


def _relu_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
