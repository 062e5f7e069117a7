"""Continuous batching: several sequences (slots) on one loaded model, their decode steps run as one batch.

A model loaded with ``slots=N`` serves N sequences from one copy of its weights. Its decoder graph takes per-row
positions and slots (``slot_graph``) where a one-sequence graph takes ``past_len``: row t of a step is a token of
sequence ``slots[t]`` at position ``positions[t]``. The projections, MLP / MoE and LM head see a ``[B, hidden]``
activation, so the weights are read once for the B rows (decode is memory-bound: that is where a batch gains), while
each stateful op (Attention's KV cache, GatedDeltaRule's recurrent and conv state) keeps one state per slot and runs
each sequence's rows on its own (``hetero.contract.opforms.slot_runs``).

``Llm.sequence(i)`` is slot i as an ``Llm`` of its own (its cache, ``generate`` / ``chat`` / ``create_*``), sharing
the weights and session; slot 0 is the model itself. Two ways to batch:

* ``decode_step(sequences, tokens)``: one batched step, called by one thread (tests, a custom loop);
* several threads, one per sequence, each generating as usual: the ``Batcher`` gathers the one-token steps that come
  together into one batched step (waiting up to ``window`` seconds for the sequences of the previous batch), and
  runs a prompt's chunks alone, alternating with the batched steps, so a new request's prefill interleaves with the
  others' decoding (``hetero serve -np N``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..contract import dtypes
from ..contract.errors import HeteroError
from ..contract.graph import Graph
from ..contract.opforms import POSITION_INPUT, SLOTS_INPUT
from ..contract.tensor import TensorInfo
from .families.decoder import INPUT_IDS, PAST_LEN

if TYPE_CHECKING:
    from ..runtime.session import Session

POSITIONS, SLOTS = "positions", "slots"  # the graph inputs of a model serving several sequences
WINDOW = 0.05  # seconds a batched step waits for the sequences of the previous one (a sequence that stopped)


def slot_graph(graph: Graph, slots: int) -> None:
    """Make a one-sequence decoder graph (inputs ``input_ids``, ``past_len``) serve ``slots`` sequences: inputs
    ``input_ids``, ``positions`` and ``slots`` (int64 ``[T]`` each); the ops that read ``past_len`` read the
    positions, and the stateful ones (``SLOTS_INPUT``) take the slots and keep ``slots`` states."""
    if PAST_LEN not in graph.inputs:
        raise HeteroError(f"graph {graph.name!r} has no {PAST_LEN!r} input: not a one-sequence decoder graph")
    for node in graph.nodes:
        if PAST_LEN not in node.inputs:
            continue
        if node.op_type not in POSITION_INPUT:
            raise HeteroError(f"node {node.name!r} ({node.op_type}) reads {PAST_LEN!r}; batching knows only "
                              f"{sorted(POSITION_INPUT)}")
        node.inputs = [POSITIONS if name == PAST_LEN else name for name in node.inputs]
        index = SLOTS_INPUT.get(node.op_type)
        if index is not None:
            node.inputs = [*[*node.inputs, *([""] * (index - len(node.inputs)))][:index], SLOTS]
            node.attrs["slots"] = slots
    graph.inputs = [*(POSITIONS if name == PAST_LEN else name for name in graph.inputs), SLOTS]
    graph.values.pop(PAST_LEN, None)
    for name in (POSITIONS, SLOTS):
        graph.values[name] = TensorInfo(dtypes.int64, (None,))


def feeds(ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> dict[str, np.ndarray]:
    return {INPUT_IDS: np.asarray(ids, dtype=np.int64), POSITIONS: np.asarray(positions, dtype=np.int64),
            SLOTS: np.asarray(slots, dtype=np.int64)}


def sequence_feeds(slot: int, ids: Sequence[int], past: int) -> dict[str, np.ndarray]:
    """The feeds of a step of one sequence: ``ids`` at positions ``past ..`` of ``slot``."""
    return feeds(ids, range(past, past + len(ids)), [slot] * len(ids))


@dataclass
class _Row:
    """One sequence's one-token step waiting for a batch, and then its result."""

    slot: int
    token: int
    position: int
    arrived: float = field(default_factory=time.monotonic)
    result: dict[str, np.ndarray] | None = None
    error: BaseException | None = None
    done: bool = False


class Batcher:
    """Runs the steps of a model's sequences on its one session (one run at a time): one-token steps that come
    together go as one batched step; a step of several tokens (a prompt chunk) runs alone, and when both wait they
    alternate. ``steps`` / ``rows``: batched steps run and the rows they carried (rows / steps: the mean batch)."""

    def __init__(self, session: Session, window: float = WINDOW) -> None:
        self.session = session
        self.window = window
        self.steps = 0
        self.rows = 0
        self._cond = threading.Condition()
        self._waiting: dict[int, _Row] = {}  # slot -> its step
        self._expected: set[int] = set()  # the slots of the last batched step: the next one waits for them
        self._busy = False
        self._free_since = time.monotonic()
        self._prompts = 0  # prompt chunks waiting for the session
        self._last_prompt = False  # the last run was a prompt chunk: waiting one-token steps go next

    def idle(self, slot: int) -> None:
        """Sequence ``slot`` takes no step for a while (its generation ended): batched steps stop waiting for it."""
        with self._cond:
            self._expected.discard(slot)
            self._cond.notify_all()

    def run(self, slot: int, ids: list[int], past: int, outputs: list[str]) -> dict[str, np.ndarray]:
        """Sequence ``slot``'s step of ``ids`` at positions ``past ..``; returns ``outputs`` (rows of that step)."""
        if len(ids) == 1:
            return self._batched(_Row(slot, ids[0], past), outputs)
        return self._alone(slot, ids, past, outputs)

    def run_rows(self, rows: Sequence[tuple[int, int, int]], outputs: list[str]) -> dict[str, np.ndarray]:
        """One batched step of ``(slot, token, position)`` rows, now (waiting only for the session)."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._busy = True
        try:
            return self._session_run(rows, outputs)
        finally:
            self._release({slot for slot, _, _ in rows}, prompt=False)

    # -- internals ------------------------------------------------------------------------------------------------
    def _session_run(self, rows: Sequence[tuple[int, int, int]], outputs: list[str]) -> dict[str, np.ndarray]:
        slots, tokens, positions = zip(*rows, strict=True)
        out = self.session.run(feeds(tokens, positions, slots), outputs)
        self.steps += 1
        self.rows += len(rows)
        return out

    def _release(self, slots: set[int] | None, *, prompt: bool) -> None:
        with self._cond:
            self._busy = False
            self._free_since = time.monotonic()
            self._last_prompt = prompt
            if slots is not None:
                self._expected = slots
            self._cond.notify_all()

    def _ready(self) -> bool:
        """Whether the waiting one-token steps should run now (called with the lock held, the session free)."""
        if self._prompts and not self._last_prompt:
            return False  # a prompt chunk waits: it goes first
        if self._expected <= self._waiting.keys():
            return True
        first = min(row.arrived for row in self._waiting.values())
        return time.monotonic() >= max(first, self._free_since) + self.window

    def _batched(self, row: _Row, outputs: list[str]) -> dict[str, np.ndarray]:
        with self._cond:
            if row.slot in self._waiting:
                raise HeteroError(f"sequence {row.slot} already has a step waiting (one thread per sequence)")
            self._waiting[row.slot] = row
            self._cond.notify_all()
            while not row.done:
                if not self._busy and self._ready():
                    batch = sorted(self._waiting.values(), key=lambda r: r.slot)
                    self._waiting.clear()
                    self._busy = True
                    break
                timeout = None
                if not self._busy:
                    start = max(min(r.arrived for r in self._waiting.values()), self._free_since)
                    timeout = max(start + self.window - time.monotonic(), 1e-3)
                self._cond.wait(timeout)
            else:
                return _result(row)
        # this thread leads the batch: it runs everyone's rows and hands each its own
        try:
            out = self._session_run([(r.slot, r.token, r.position) for r in batch], outputs)
            for i, r in enumerate(batch):
                r.result = {name: out[name][i:i + 1] for name in outputs}
        except BaseException as exc:  # every row of a failed step gets its error
            for r in batch:
                r.error = exc
        finally:
            for r in batch:
                r.done = True
            self._release({r.slot for r in batch}, prompt=False)
        return _result(row)

    def _alone(self, slot: int, ids: list[int], past: int, outputs: list[str]) -> dict[str, np.ndarray]:
        with self._cond:
            self._expected.discard(slot)
            self._prompts += 1
            try:
                while self._busy or (self._last_prompt and self._waiting):
                    self._cond.wait()
            finally:
                self._prompts -= 1
            self._busy = True
        try:
            out = self.session.run(sequence_feeds(slot, ids, past), outputs)
        finally:
            self._release(None, prompt=True)
        return out


def _result(row: _Row) -> dict[str, np.ndarray]:
    if row.error is not None:
        raise row.error
    assert row.result is not None
    return row.result


def decode_step(sequences: Sequence[Any], tokens: Sequence[int]) -> np.ndarray:
    """One batched decode step: ``tokens[i]`` goes after ``sequences[i]``'s cached tokens (sequences of one model,
    ``hetero.llm.Llm.sequence``, each at most once); returns each one's next-token logits, float32
    ``[len(sequences), vocab]`` (row i: sequence i's): what ``sequences[i].forward([tokens[i]])`` gives alone."""
    if not sequences:
        raise HeteroError("decode_step needs at least one sequence")
    if len(tokens) != len(sequences):
        raise HeteroError(f"decode_step: {len(tokens)} tokens for {len(sequences)} sequences; expected one each")
    batcher = sequences[0]._batch
    if batcher is None or any(s._batch is not batcher for s in sequences):
        raise HeteroError("decode_step takes sequences of one model loaded with slots=N (llm.sequence(i))")
    slots = [s._slot for s in sequences]
    if len(set(slots)) != len(slots):
        raise HeteroError(f"decode_step: a sequence appears twice (slots {slots})")
    locks = [s._lock for s in sorted(sequences, key=lambda s: s._slot)]  # one order: no deadlock with another call
    for lock in locks:
        lock.acquire()
    try:
        pasts = [s._check_step([int(t)]) for s, t in zip(sequences, tokens, strict=True)]
        wanted = sequences[0]._step_outputs()
        out = batcher.run_rows(list(zip(slots, [int(t) for t in tokens], pasts, strict=True)), wanted)
        rows = []
        for i, (seq, token, past) in enumerate(zip(sequences, tokens, pasts, strict=True)):
            seq._owner = None
            rows.append(seq._took([int(token)], past, {name: value[i:i + 1] for name, value in out.items()}))
        return np.concatenate(rows)
    finally:
        for lock in reversed(locks):
            lock.release()


__all__ = ["POSITIONS", "SLOTS", "Batcher", "decode_step", "slot_graph"]
