"""``hetero serve -np N`` as it runs now: N slots on the sequences of one model (``load(..., slots=N)``), their decode
steps batched. Concurrent clients get exactly their own answers, the steps did go together, and a client that
disconnects frees its slot at once while the others go on."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module, reason=f"{_module} is not installed (pip install 'hetero[serve]')")

from .serve_harness import running  # noqa: E402  (after the skips: it imports uvicorn)
from .serve_models import load_model  # noqa: E402

PROMPTS = ["alpha", "beta gamma", "delta", "epsilon zeta eta"]


def _ask_all(server, prompts: list[str], max_tokens: int) -> list[str]:
    got: list = [None] * len(prompts)

    def ask(i: int) -> None:
        status, body = server.post("/v1/completions", {"prompt": prompts[i], "max_tokens": max_tokens,
                                                       "temperature": 0.7, "seed": 9})
        got[i] = body["choices"][0]["text"] if status == 200 else body

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return got


def test_concurrent_requests_on_batched_slots_get_what_each_gets_alone(llm):
    want = [llm.create_completion(p, max_tokens=12, temperature=0.7, seed=9)["choices"][0]["text"] for p in PROMPTS]
    model = load_model(slots=4)
    with running(model.sequences(), name="tiny", max_queue=8) as server:
        assert _ask_all(server, PROMPTS, 12) == want
        assert _ask_all(server, PROMPTS[::-1], 12) == want[::-1]  # slots reused, with other caches
        status, _, raw = server.request("GET", "/health")
        assert status == 200 and json.loads(raw)["slots"] == 4
    batcher = model._batch
    assert batcher.rows > 1.5 * batcher.steps  # 4 clients: the decode steps carried several rows


def test_a_disconnect_frees_its_slot_at_once_while_the_others_decode():
    model = load_model(context=4096, slots=2)
    with running(model.sequences(), max_queue=2) as server:
        scheduler = server.app.state.scheduler
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = json.dumps({"prompt": "long", "max_tokens": 3000, "temperature": 0.8, "seed": 1, "stream": True})
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        other: list = []
        worker = threading.Thread(target=lambda: other.append(_ask_all(server, ["beta gamma"], 40)))
        worker.start()
        conn.close()  # gone: its generation stops, its slot is free
        started = time.monotonic()
        while scheduler.busy > 1 and time.monotonic() - started < 20:
            time.sleep(0.01)
        worker.join(timeout=120)
        assert time.monotonic() - started < 20
        want = load_model().create_completion("beta gamma", max_tokens=40, temperature=0.7, seed=9)
        assert other == [[want["choices"][0]["text"]]]
        while scheduler.busy and time.monotonic() - started < 20:
            time.sleep(0.01)
        assert scheduler.busy == 0
        assert max(len(s.tokens) for s in model.sequences()) < 3000  # the cancelled one stopped early
