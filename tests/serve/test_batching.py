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
    model._batch.window = 2.0  # a loaded machine may delay a slot's thread past the 50 ms default: wait for it
    with running(model.sequences(), name="tiny", max_queue=8) as server:
        assert _ask_all(server, PROMPTS, 12) == want
        assert _ask_all(server, PROMPTS[::-1], 12) == want[::-1]  # slots reused, with other caches
        status, _, raw = server.request("GET", "/health")
        assert status == 200 and json.loads(raw)["slots"] == 4
        status, _, raw = server.request("GET", "/metrics")
        figures = {line.split()[0]: float(line.split()[1]) for line in raw.decode().splitlines()
                   if line.startswith("hetero_batch_")}
        stats = model._batch.stats
        assert figures["hetero_batch_steps_total"] == stats.steps > 0
        assert figures["hetero_batch_rows_total"] == stats.rows == stats.decode_rows + stats.prompt_rows
        assert figures["hetero_batch_isolated_steps_total"] == 0
        assert 0 < figures["hetero_batch_run_seconds_total"] <= figures["hetero_batch_step_seconds_total"]
    batcher = model._batch
    assert batcher.rows > 1.5 * batcher.steps, (batcher.rows, batcher.steps)  # steps carried several rows


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


POISON = 199  # a token id whose step the wrapped Embedding kernel fails, as a kernel failing on an input would


def _poison_embedding(model) -> None:
    """Make the model's real Embedding kernel fail every step that carries ``POISON`` (interpreted: no replay of the
    bound call), as a backend failing on one request's input would."""
    from hetero.runtime.executor import KernelProgram

    step = next(s for p in model.session.programs if isinstance(p, KernelProgram) for s in p.steps
                if s.node.op_type == "Embedding")
    kernel = step.kernel
    real_run = kernel.run

    def run(inputs, outputs):
        if POISON in inputs[0].buffer.reshape(-1).tolist():
            raise RuntimeError("the device refused this input")
        real_run(inputs, outputs)

    kernel.run = run
    kernel.bind = lambda inputs, outputs: None
    model.session.invalidate_replay()


def test_a_failed_fused_step_fails_only_the_request_whose_input_caused_it(llm):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, POISON, 13], [21, 22, 23], [31, 32, 33, 34], [41, 42, 43]]
    want = {i: llm.create_completion(prompts[i], max_tokens=8, temperature=0.7, seed=4)["choices"][0]["text"]
            for i in (0, 2, 3)}
    model = load_model(slots=3)
    model._batch.window, model._batch.gather = 2.0, 1.0  # the three prompts go in one step, then decode together
    _poison_embedding(model)
    with running(model.sequences(), name="tiny", max_queue=8) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        got: dict = {}

        def ask(i: int) -> None:
            try:
                r = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=8, temperature=0.7, seed=4)
                got[i] = r.choices[0].text
            except openai.APIStatusError as exc:
                got[i] = exc

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert model._batch.stats.isolated >= 1  # the step carrying all three failed and was run again one by one
        assert got[0] == want[0] and got[2] == want[2]
        error = got[1]
        assert isinstance(error, openai.BadRequestError), error
        assert "Embedding" in error.body["message"] and "the device refused this input" in error.body["message"]
        assert error.body["type"] == "invalid_request_error"
        again = client.completions.create(model="tiny", prompt=prompts[2], max_tokens=8, temperature=0.7, seed=4)
        assert again.choices[0].text == want[2]  # the server goes on serving
        # a decode step: new prompts (computed together in one step), the second one's first token forced to the
        # poison, so the decode step carrying both rows fails
        before = model._batch.stats.isolated
        got.clear()
        forced = {"logit_bias": {str(POISON): 100}}

        def ask_forced() -> None:
            try:
                client.completions.create(model="tiny", prompt=prompts[4], max_tokens=8, extra_body=forced)
            except openai.APIStatusError as exc:
                got[4] = exc

        threads = [threading.Thread(target=ask, args=(3,)), threading.Thread(target=ask_forced)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert got[3] == want[3] and isinstance(got[4], openai.BadRequestError)
        assert model._batch.stats.isolated > before
