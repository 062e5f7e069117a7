"""Resumable streams (``hetero serve --resume-window``): a client that drops a streamed chat completion reconnects
with its stream id and ``Last-Event-ID`` and gets the events it missed, then the rest — the whole reply as one
uninterrupted stream gives it; an unknown or expired id is a 404 error object; with no window a client gone frees
its slot at once. Real HTTP clients against the running server."""

from __future__ import annotations

import asyncio
import http.client
import json
import time

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module, reason=f"{_module} is not installed (pip install 'hetero[serve]')")

from .serve_harness import running  # noqa: E402  (after the skips: it imports uvicorn)
from .serve_models import load_model  # noqa: E402


def _request(llm, max_tokens: int = 40) -> dict:
    """A streamed greedy chat of exactly ``max_tokens`` tokens (end-of-sequence banned)."""
    return {"messages": [{"role": "user", "content": "count"}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "logit_bias": {str(t): -100 for t in llm.eos_ids}}


def _open(port: int, method: str, path: str, body: dict | None = None,
          headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json", **(headers or {})})
    return conn.getresponse()


def _events(response: http.client.HTTPResponse, limit: int | None = None) -> list[tuple[int | None, str]]:
    """(id, data) of each server-sent event, up to ``limit`` events."""
    events: list[tuple[int | None, str]] = []
    event_id = None
    while limit is None or len(events) < limit:
        line = response.readline()
        if not line:
            break
        line = line.rstrip(b"\n")
        if line.startswith(b"id: "):
            event_id = int(line[4:])
        elif line.startswith(b"data: "):
            events.append((event_id, line[6:].decode()))
            event_id = None
            if line == b"data: [DONE]":
                break
    return events


def _text(events: list[tuple[int | None, str]]) -> str:
    chunks = [json.loads(data) for _, data in events if data != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


@pytest.fixture(scope="module")
def model():
    return load_model(context=512)


def test_a_dropped_stream_resumes_where_the_client_left(model):
    with running([model], resume_window=10) as server:
        whole = _open(server.port, "POST", "/v1/chat/completions", _request(model))
        assert whole.status == 200
        want = _events(whole)
        assert want[-1][1] == "[DONE]" and [i for i, _ in want[:-1]] == list(range(1, len(want)))

        first = _open(server.port, "POST", "/v1/chat/completions", _request(model))
        stream_id = first.getheader("X-Stream-Id")
        head = _events(first, 3)
        first.close()  # the client goes away after 3 events
        assert stream_id and all(json.loads(d)["id"] == stream_id for _, d in head)
        time.sleep(0.3)  # the generation goes on without it
        again = _open(server.port, "GET", f"/v1/streams/{stream_id}", headers={"Last-Event-ID": str(head[-1][0])})
        assert again.status == 200 and again.getheader("X-Stream-Id") == stream_id
        tail = _events(again)
        assert tail[0][0] == head[-1][0] + 1 and tail[-1][1] == "[DONE]"
        assert _text(head + tail) == _text(want) and len(head + tail) == len(want)

        # a second reconnection (?after=N) replays from anywhere while the stream is kept
        replay = _events(_open(server.port, "GET", f"/v1/streams/{stream_id}?after=0"))
        assert _text(replay) == _text(want)
        metrics = server.request("GET", "/metrics")[2].decode()
        assert "hetero_streams_resumed_total 2.0" in metrics


def test_unknown_expired_and_malformed_resumes_are_error_objects(model):
    with running([model], resume_window=0.5) as server:
        status, _, raw = server.request("GET", "/v1/streams/chatcmpl-nope")
        assert status == 404 and json.loads(raw)["error"]["code"] == "stream_not_found"
        response = _open(server.port, "POST", "/v1/chat/completions", _request(model, 3))
        stream_id = response.getheader("X-Stream-Id")
        assert _events(response)[-1][1] == "[DONE]"
        status, _, raw = server.request("GET", f"/v1/streams/{stream_id}", headers={"Last-Event-ID": "x1"})
        assert status == 400 and json.loads(raw)["error"]["param"] == "after"
        time.sleep(0.7)  # past the window after the stream ended
        status, _, raw = server.request("GET", f"/v1/streams/{stream_id}")
        assert status == 404 and "window" in json.loads(raw)["error"]["message"]


def test_an_abandoned_stream_is_cancelled_after_its_window():
    llm = load_model(context=4096)
    # a short window: the fixture decodes thousands of tokens a second (the 3000 were done within 0.5 s on the
    # quiet machine once Session.run's fast path landed), and the test is that the stream stops before them
    with running([llm], resume_window=0.05) as server:
        scheduler = server.app.state.scheduler
        response = _open(server.port, "POST", "/v1/chat/completions", _request(llm, 3000))
        _events(response, 1)
        response.close()
        deadline = time.monotonic() + 20
        while scheduler.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scheduler.busy == 0  # nobody came back: the generation stopped, the slot is free
        assert len(llm.tokens) < 3000  # long before its 3000 tokens
        status, _, _ = server.request("GET", f"/v1/streams/{response.getheader('X-Stream-Id')}")
        assert status == 404


def test_without_a_window_there_is_nothing_to_resume(model):
    with running([model]) as server:
        response = _open(server.port, "POST", "/v1/chat/completions", _request(model, 3))
        stream_id = response.getheader("X-Stream-Id")
        events = _events(response)
        assert stream_id and events[-1][1] == "[DONE]" and all(i is None for i, _ in events)
        status, _, raw = server.request("GET", f"/v1/streams/{stream_id}")
        assert status == 404 and "--resume-window" in json.loads(raw)["error"]["message"]


def test_the_store_keeps_bounded_streams_and_bytes():
    from hetero.serve.streams import DONE, StreamStore

    async def events(n: int, size: int):
        for i in range(n):
            yield b"data: " + bytes([97 + i % 26]) * size + b"\n\n"
        yield DONE

    async def scenario() -> None:
        store = StreamStore(window=30, max_streams=2, max_bytes=1000)
        long = store.start("long", events(10, 200))  # 2 kB of events: cut with an error event
        got = [e async for e in store.follow(long)]
        assert got[-1] == DONE and b'"error"' in got[-2] and long.nbytes <= 1000 + 200
        assert got[0].startswith(b"id: 1\ndata: ")
        short = store.start("short", events(2, 10))
        assert len([e async for e in store.follow(short)]) == 3
        third = store.start("third", events(1, 10))  # full: the oldest finished stream makes room
        assert store.get("long") is None and store.get("short") is short and store.get("third") is third
        assert [e async for e in store.follow(short, after=2)] == [DONE]

    asyncio.run(scenario())


def test_the_openai_client_reads_resumable_streams(model):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
    with running([model], resume_window=5) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        body = _request(model, 12)
        kwargs = {k: body[k] for k in ("messages", "max_tokens", "temperature", "logit_bias")}
        chunks = list(client.chat.completions.create(model=model.name, stream=True, **kwargs))
        whole = client.chat.completions.create(model=model.name, **kwargs)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            whole.choices[0].message.content
