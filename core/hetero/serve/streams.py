"""Resumable streams: a streamed completion whose client went away keeps going for a short window, and a client
that comes back with its id gets the events it missed, then the rest as they come (llama.cpp's SSE replay idea).

Each event is sent with an SSE ``id:`` line (its index from 1). A client reconnects with
``GET /v1/streams/{stream_id}`` and the standard ``Last-Event-ID`` header (or ``?after=N``): the events after that
one are replayed, then the stream follows live, then ``data: [DONE]``. The stream id is the completion's ``id``
(every chunk's ``id`` field) and the ``X-Stream-Id`` response header.

Bounds: a stream with no client is cancelled ``window`` seconds after its last client left (its slot freed), and a
finished one is forgotten ``window`` seconds after it ended; at most ``max_streams`` are kept (the oldest finished
ones go first; past that a new stream is not resumable) and a stream's events are kept up to ``max_bytes`` (past
that it ends with an error event rather than grow). With ``window`` 0 the app keeps no stream (its client's
reading drives the generation, and a client gone cancels it at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

DONE = b"data: [DONE]\n\n"


@dataclass
class Stream:
    id: str
    events: list[bytes] = field(default_factory=list)  # each a ``data: ...`` block, without its id line
    nbytes: int = 0
    done: bool = False
    clients: int = 0
    ended_at: float = 0.0  # when it finished or its last client left (monotonic)
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, event: bytes) -> None:
        self.events.append(event)
        self.nbytes += len(event)
        self._wake()

    def finish(self) -> None:
        self.done = True
        self.ended_at = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class StreamStore:
    def __init__(self, window: float = 0.0, max_streams: int = 64, max_bytes: int = 4 << 20) -> None:
        self.window = window
        self.max_streams = max_streams
        self.max_bytes = max_bytes
        self._streams: OrderedDict[str, Stream] = OrderedDict()
        self.resumed = 0  # reconnections served

    def __len__(self) -> int:
        return len(self._streams)

    def start(self, stream_id: str, events: AsyncIterator[bytes]) -> Stream:
        """Run ``events`` (SSE ``data:`` blocks, ending with ``[DONE]``) into a new stream, in a task of its own."""
        self._expire()
        stream = Stream(stream_id)
        if self.window > 0 and stream_id not in self._streams:
            finished = [k for k, s in self._streams.items() if s.done]
            if len(self._streams) >= self.max_streams and finished:
                del self._streams[finished[0]]  # the oldest finished one makes room
            if len(self._streams) < self.max_streams:
                self._streams[stream_id] = stream
        stream.task = asyncio.get_running_loop().create_task(self._pump(stream, events))
        return stream

    def get(self, stream_id: str) -> Stream | None:
        self._expire()
        return self._streams.get(stream_id)

    async def follow(self, stream: Stream, after: int = 0) -> AsyncIterator[bytes]:
        """The stream's events after the ``after``-th, each with its ``id:`` line, then the live ones to the end.
        The last client leaving starts the stream's window (or, with none, cancels it)."""
        stream.clients += 1
        sent = max(after, 0)
        numbered = stream.id in self._streams  # ids only where they can be used: a stream kept for resuming
        try:
            while True:
                while sent < len(stream.events):
                    event = stream.events[sent]
                    sent += 1
                    yield b"id: %d\n" % sent + event if numbered and event != DONE else event
                if stream.done:
                    return
                await stream.changed.wait()
        finally:
            stream.clients -= 1
            if stream.clients == 0 and not stream.done:
                stream.ended_at = time.monotonic()
                if self.window <= 0 or stream.id not in self._streams:
                    self._cancel(stream)
                else:
                    asyncio.get_running_loop().call_later(self.window, self._abandon, stream)

    async def _pump(self, stream: Stream, events: AsyncIterator[bytes]) -> None:
        try:
            async for event in events:
                if stream.nbytes + len(event) > self.max_bytes and event != DONE:
                    stream.append(b'data: {"error": {"message": "the stream is longer than the server keeps '
                                  b'for resuming", "type": "server_error", "param": null, "code": null}}\n\n')
                    stream.append(DONE)
                    break
                stream.append(event)
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]  # frees the slot
            stream.finish()

    def _abandon(self, stream: Stream) -> None:
        """The window after the last client left has passed: with no client back, cancel the generation."""
        if stream.clients == 0 and not stream.done:
            self._cancel(stream)
        self._expire()

    def _cancel(self, stream: Stream) -> None:
        if stream.task is not None:
            stream.task.cancel()
        self._streams.pop(stream.id, None)

    def close(self) -> None:
        """Cancel every kept stream still generating (the server stops)."""
        for stream in list(self._streams.values()):
            if not stream.done:
                self._cancel(stream)

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._streams.items() if s.done and now - s.ended_at >= self.window]:
            del self._streams[key]


__all__ = ["DONE", "Stream", "StreamStore"]
