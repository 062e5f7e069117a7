"""Slots and the request queue: each slot is a thread that runs one request at a time on its sequence of the model;
requests wait in a bounded queue (full: ``QueueFull``, HTTP 429) and a cancelled request frees its slot at the next
token.

The slots' models are the sequences of one model loaded with ``slots=N`` (``Llm.sequences()``: one copy of the
weights, a KV cache each): the slot threads' decode steps meet in the model's batcher and run as one batched step
(``hetero.llm.batch``), and a new request's prompt runs in chunks within those steps (continuous batching). A list
of separately loaded models works too (each slot then decodes alone).

Each slot's sequence keeps its KV cache between requests, so a request that starts with what the previous one on
that slot had (a conversation's earlier turns, a shared system prompt) computes only the new tokens; a request goes
to the free slot whose cache shares the longest prefix with its prompt.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..llm.openai_api import common_prefix

log = logging.getLogger("hetero.serve")

Work = Callable[[Any], Iterator[Any]]  # runs on a slot's thread with its model; yields what the client gets
_END = object()


class QueueFull(Exception):
    """Every slot is busy and the queue holds its maximum."""


@dataclass
class _Job:
    work: Work
    prompt: list[int]  # for choosing the slot with the longest cached prefix (may be empty)
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class Scheduler:
    """``models``: one per slot (each with its own KV cache: ``llm.sequences()``); ``max_queue``: requests that may
    wait for a slot."""

    def __init__(self, models: list[Any], max_queue: int) -> None:
        if not models:
            raise ValueError("a scheduler needs at least one model")
        self.models = models
        self.max_queue = max_queue
        self._pending: list[_Job] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._free = list(range(len(models)))
        self.busy = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._slot, args=(i,), name=f"hetero-slot-{i}", daemon=True)
                         for i in range(len(models))]
        for t in self._threads:
            t.start()

    @property
    def waiting(self) -> int:
        return len(self._pending)

    async def run(self, work: Work, prompt: list[int] | None = None) -> AsyncGenerator[Any, None]:
        """What ``work`` yields, as it comes; leaving early (a client gone) cancels it and frees its slot."""
        job = _Job(work, list(prompt or []), asyncio.get_running_loop())
        with self._lock:
            if len(self._pending) >= self.max_queue and not self._free:
                raise QueueFull(f"all {len(self.models)} slot(s) are busy and {len(self._pending)} request(s) wait")
            self._pending.append(job)
            self._wake.notify_all()
        try:
            while True:
                item = await job.events.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancelled.set()
            with self._lock:
                if job in self._pending:
                    self._pending.remove(job)

    def _take(self, slot: int) -> _Job | None:
        """The next job for ``slot`` (called with the lock held): the oldest, unless another waiting one shares a
        longer prefix with this slot's cache."""
        if not self._pending:
            return None
        cached = self.models[slot].tokens
        best = max(range(len(self._pending)), key=lambda i: (common_prefix(cached, self._pending[i].prompt), -i))
        return self._pending.pop(best)

    def _slot(self, index: int) -> None:
        model = self.models[index]
        while True:
            with self._lock:
                while not self._closed and not self._pending:
                    self._wake.wait()
                if self._closed:
                    return
                job = self._take(index)
                if job is None:
                    continue
                self._free.remove(index)
                self.busy += 1
            try:
                self._serve(job, model)
            finally:
                model.idle()  # the batched steps of the other slots stop waiting for this one
                with self._lock:
                    self.busy -= 1
                    self._free.append(index)

    def _serve(self, job: _Job, model: Any) -> None:
        if job.cancelled.is_set():
            return
        items = job.work(model)
        try:
            for item in items:
                if job.cancelled.is_set():
                    break
                job.send(item)
        except Exception as exc:  # handed to the request's task, which answers with an error object
            job.send(exc)
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # stops the generation: the slot is free for the next request
        job.send(_END)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        for t in self._threads:
            t.join(timeout=5)

    def cache_tokens(self) -> int:
        return sum(len(m.tokens) for m in self.models)
