"""Staying up: many Session.run calls and many chat requests through the server, with resident memory and per-call
latency checked for growth (loose bounds: the machine is shared) and the figures printed.

The default run is bounded (1000 runs, 200 requests); HETERO_SOAK_SCALE=10 multiplies both for a long run:
    HETERO_SOAK_SCALE=10 pytest tests/serve/test_soak.py -s
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hetero
from hetero.demo import tiny_cnn

SCALE = int(os.environ.get("HETERO_SOAK_SCALE", "1"))
STATM = Path("/proc/self/statm")
pytestmark = pytest.mark.skipif(not STATM.exists(), reason="resident memory is read from /proc/self/statm (Linux)")


def rss_mb() -> float:
    pages = int(STATM.read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def check_flat(what: str, latencies: list[float], rss: list[float], max_growth_mb: float) -> None:
    """Latency of the last tenth vs the first tenth (after the warm-up), and memory growth from the first tenth."""
    tenth = max(len(latencies) // 10, 1)
    early, late = statistics.median(latencies[:tenth]), statistics.median(latencies[-tenth:])
    growth = rss[-1] - rss[tenth]
    print(f"\n{what}: {len(latencies)} calls, median {early * 1e3:.2f} ms early / {late * 1e3:.2f} ms late, "
          f"RSS {rss[0]:.0f} -> {rss[tenth]:.0f} -> {rss[-1]:.0f} MiB (growth {growth:+.1f} MiB), "
          f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    assert growth < max_growth_mb, f"{what}: resident memory grew by {growth:.1f} MiB"
    assert late < 3 * early + 0.005, f"{what}: calls slowed from {early * 1e3:.2f} to {late * 1e3:.2f} ms"


def test_session_run_soak():
    session = hetero.Session(tiny_cnn(), backends=["cpu"], on_fallback="silent")
    rng = np.random.default_rng(0)
    images = [rng.normal(size=(1 + i % 2, 3, 32, 32)).astype(np.float32) for i in range(4)]
    want = [session.run({"image": x})["probs"] for x in images]
    latencies, rss = [], []
    for i in range(1000 * SCALE):
        started = time.perf_counter()
        out = session.run({"image": images[i % 4]})["probs"]
        latencies.append(time.perf_counter() - started)
        rss.append(rss_mb())
        if i % 97 == 0:
            np.testing.assert_array_equal(out, want[i % 4])
    check_flat("Session.run", latencies, rss, max_growth_mb=32)


def test_chat_requests_through_the_server_soak():
    for module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install 'hetero[serve]')")
    from .serve_harness import running
    from .serve_models import load_model

    llm = load_model(context=256)
    latencies, rss = [], []
    with running([llm], max_queue=4) as server:
        for i in range(200 * SCALE):
            messages = [{"role": "user", "content": f"question {i % 7}"}]
            started = time.perf_counter()
            status, body = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4,
                                                                "temperature": 0.7, "seed": i})
            latencies.append(time.perf_counter() - started)
            rss.append(rss_mb())
            assert status == 200 and body["usage"]["completion_tokens"] <= 4, body
    check_flat("chat requests", latencies, rss, max_growth_mb=64)
