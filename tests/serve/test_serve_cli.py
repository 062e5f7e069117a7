"""``hetero serve MODEL`` as a user runs it: a subprocess that loads the model, listens, answers, and stops on
Ctrl-C (SIGINT) with exit status 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module, reason=f"{_module} is not installed (pip install 'hetero[serve]')")

from .serve_models import MODEL  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_hetero_serve_answers_and_stops_on_ctrl_c():
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hetero", "serve", str(MODEL), "--port", str(port), "-c", "128",
                             "-t", "1", "--alias", "tiny", "--log-level", "warning", "--prefix-cache", "16",
                             "--resume-window", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                health = _get(f"http://127.0.0.1:{port}/health")
                break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not start: {proc.communicate(timeout=10)}")
                time.sleep(0.2)
        assert health["status"] == "ok" and health["slots"] == 1
        assert _get(f"http://127.0.0.1:{port}/v1/models")["data"][0]["id"] == "tiny"
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.loads(response.read())["usage"]["completion_tokens"] == 3
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert b"hetero_prefix_cache_bytes " in response.read()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"on http://127.0.0.1:{port}/v1 (1 slot(s), context 128" in err
    assert "prefix cache 16 MiB, resume window 5 s" in err
    assert "Traceback" not in err


def test_hetero_serve_without_a_model_is_one_error_line():
    result = subprocess.run([sys.executable, "-m", "hetero", "serve"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("hetero: error: no model given")
