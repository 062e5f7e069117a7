"""``hetero serve``'s app, running under uvicorn on a loopback port, driven by the official ``openai`` client and by
raw HTTP: endpoints, streaming, errors as OpenAI error objects, the queue's 429, disconnects freeing the slot,
metrics."""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module, reason=f"{_module} is not installed (pip install 'hetero[serve]')")

from .serve_harness import running  # noqa: E402  (after the skips: it imports uvicorn)
from .serve_models import load_model  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(llm):
    with running([llm], name="tiny", max_queue=4, max_body_bytes=64 << 10) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_the_openai_client_chats(client, llm):
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=6, temperature=0, seed=1)
    want = llm.create_chat_completion(HI, max_tokens=6, temperature=0, seed=1)
    assert r.object == "chat.completion" and r.model == llm.name
    assert r.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == want["usage"]["prompt_tokens"] and r.usage.completion_tokens == 6


def test_the_openai_client_streams(client):
    whole = client.chat.completions.create(model="tiny", messages=HI, max_tokens=10, temperature=0.9, seed=3)
    stream = client.chat.completions.create(model="tiny", messages=HI, max_tokens=10, temperature=0.9, seed=3,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_models_logprobs_and_json_mode(client):
    r = client.completions.create(model="tiny", prompt="the sky", max_tokens=4, temperature=0, logprobs=2)
    assert r.object == "text_completion" and len(r.choices[0].logprobs.token_logprobs) == 4
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="the sky", max_tokens=4, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    (model,) = client.models.list().data
    assert model.id == "tiny"
    pytest.importorskip("llguidance", reason="llguidance is not installed (pip install 'hetero[serve]')")
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=80, temperature=0.8, seed=2,
                                       response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
                                           "type": "object", "properties": {"n": {"type": "integer"}},
                                           "required": ["n"], "additionalProperties": False}}})
    assert isinstance(json.loads(r.choices[0].message.content)["n"], int)


def test_client_errors_are_openai_error_objects(client, server):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, temperature=5)
    assert "temperature" in info.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=HI)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="word " * 400, max_tokens=2)
    assert info.value.code == "context_length_exceeded"


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{not json", 400, "not JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"messages": []}', 400, "messages"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', 400, "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}', 400, "frobnicate"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"a": 1}}', 400, "logit_bias"),
    (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}', 400, "xml"),
    (b"\xff\xfe", 400, "not JSON"),
    (b"[" * 100000 + b"]" * 100000, 413, "larger than"),
])
def test_malformed_bodies_are_4xx_with_an_error_object(server, body, status, needle):
    got, _, raw = server.request("POST", "/v1/chat/completions", body)
    assert got == status, raw[:300]
    error = json.loads(raw)["error"]
    assert needle in error["message"] and error["type"] and "Traceback" not in raw.decode()


def test_unknown_routes_and_methods_and_the_health_and_metrics_endpoints(server):
    status, _, raw = server.request("GET", "/v1/nothing")
    assert status == 404 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    status, _, raw = server.request("GET", "/v1/chat/completions")
    assert status == 405 and "error" in json.loads(raw)
    status, _, raw = server.request("GET", "/health")
    assert status == 200 and json.loads(raw)["status"] == "ok"
    server.post("/v1/completions", {"prompt": "abc", "max_tokens": 3, "temperature": 0})
    status, headers, raw = server.request("GET", "/metrics")
    text = raw.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("hetero_requests_total", "hetero_generated_tokens_total", "hetero_queue_depth",
                 "hetero_prefill_tokens_per_second", "hetero_decode_tokens_per_second", "hetero_kv_cache_tokens",
                 "hetero_time_to_first_token_seconds_bucket"):
        assert name in text, name
    assert 'hetero_requests_total{endpoint="chat",status="400"}' in text


def _stream_request(port: int, max_tokens: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"messages": HI, "max_tokens": max_tokens, "temperature": 0.8, "seed": 1, "stream": True})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    return conn


def test_a_full_queue_is_429_and_a_disconnect_frees_the_slot():
    llm = load_model(context=4096)
    with running([llm], max_queue=1) as server:
        scheduler = server.app.state.scheduler
        busy = _stream_request(server.port, 3000)  # holds the only slot
        response = busy.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
        waiting = _stream_request(server.port, 2)  # fills the queue of one
        deadline = time.monotonic() + 10
        while scheduler.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, headers, raw = server.request("POST", "/v1/chat/completions", json.dumps({"messages": HI}))
        assert status == 429 and headers.get("retry-after") == "1"
        assert json.loads(raw)["error"]["code"] == "queue_full"
        busy.close()  # the client goes away: its generation stops and the waiting request gets the slot
        started = time.monotonic()
        second = waiting.getresponse()
        assert second.status == 200 and b"[DONE]" in second.read()
        assert time.monotonic() - started < 20
        waiting.close()
        while scheduler.busy and time.monotonic() - started < 20:
            time.sleep(0.01)
        assert scheduler.busy == 0 and scheduler.waiting == 0
        generated = len(llm.tokens)
        assert generated < 3000  # the cancelled one stopped long before its 3000 tokens
        status, body = server.post("/v1/embeddings", {"input": "x"})  # loaded without embeddings=True
        assert status == 400 and body["error"]["code"] == "embeddings_disabled"


def test_concurrent_clients_each_get_their_own_answer(server, llm):
    prompts = ["alpha", "beta gamma", "delta", "epsilon zeta eta"]
    want = [llm.create_completion(p, max_tokens=8, temperature=0.7, seed=9)["choices"][0]["text"] for p in prompts]
    got: list = [None] * len(prompts)

    def ask(i: int) -> None:
        got[i] = server.post("/v1/completions", {"prompt": prompts[i], "max_tokens": 8, "temperature": 0.7,
                                                 "seed": 9})[1]["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == want


def test_embeddings_are_the_models_pooled_hidden_states(client, llm):
    r = client.embeddings.create(model="tiny", input=["hello world", "goodbye"])
    assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens > 0
    want = llm.embed("goodbye")
    got = np.asarray(r.data[1].embedding)
    assert got.shape == (llm.config.hidden_size,) and np.linalg.norm(got) == pytest.approx(1, abs=1e-5)
    np.testing.assert_allclose(got, want, atol=1e-5)
    short = client.embeddings.create(model="tiny", input="goodbye", dimensions=8, encoding_format="float")
    assert len(short.data[0].embedding) == 8
    with pytest.raises(pytest.importorskip("openai").BadRequestError):
        client.embeddings.create(model="tiny", input="x", dimensions=10_000)
