"""Continuous batching: several sequences (slots) on one loaded model, their steps run together.

A model loaded with ``slots=N`` serves N sequences from one copy of its weights. Its decoder graph takes per-row
positions and slots (``slot_graph``) where a one-sequence graph takes ``past_len``: row t of a step is a token of
sequence ``slots[t]`` at position ``positions[t]``, and ``logit_rows`` names the rows whose logits it computes. The
projections, MLP / MoE and LM head see a ``[T, hidden]`` activation, so the weights are read once for all rows
(decode is memory-bound: that is where a batch gains), while each stateful op (Attention's KV cache,
GatedDeltaRule's recurrent and conv state) keeps one state per slot and runs each sequence's rows as that
sequence's one-sequence step (``hetero.contract.opforms.slot_runs``) — bit for bit what it computes alone.

``Llm.sequence(i)`` is slot i as an ``Llm`` of its own (its cache, ``generate`` / ``chat`` / ``create_*``), sharing
the weights and session; slot 0 is the model itself. Two ways to batch:

* ``decode_step(sequences, tokens)``: one batched decode step, called by one thread (tests, a custom loop);
* several threads, one per sequence, each generating as usual (``hetero serve -np N``): the ``Batcher`` runs what
  they submit as llama.cpp's server does — each step carries every waiting one-token step (decode rows) and,
  beside them, waiting prompt chunks (``CHUNK`` tokens of a sequence's prompt, ``BUDGET`` tokens in all), so a new
  request's prompt is computed in the same runs as the others' next tokens instead of between them.
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
from .families.decoder import INPUT_IDS, LAST_TOKENS, PAST_LEN, VERIFY_ROWS

if TYPE_CHECKING:
    from ..runtime.session import Session

POSITIONS, SLOTS = "positions", "slots"  # the graph inputs of a model serving several sequences
LOGIT_ROWS = "logit_rows"  # ... and the rows of a step whose logits it computes (int64 [R], ascending)
# Waits are generous: a thread of a loaded machine (a load average of 12 on 2 cores) was measured coming back more
# than 50 ms after its step, and a server's slots say when they stop (Llm.idle), so waiting costs nothing there.
WINDOW = 0.1  # seconds a step waits for the sequences of the previous one (one may have stopped)
GATHER = 0.05  # seconds a prompt waits for other prompts while no sequence decodes (requests sent together)
CHUNK = 128  # prompt tokens per step of one sequence of a model of several (its prompt runs in such chunks)
BUDGET = 512  # prompt tokens a step carries at most beside its decode rows (llama.cpp's n_ubatch)


def slot_graph(graph: Graph, slots: int) -> None:
    """Make a one-sequence decoder graph (inputs ``input_ids``, ``past_len``) serve ``slots`` sequences: inputs
    ``input_ids``, ``positions`` and ``slots`` (int64 ``[T]`` each); the ops that read ``past_len`` read the
    positions, and the stateful ones (``SLOTS_INPUT``) take the slots and keep ``slots`` states. The LM head's
    rows, the last ``VERIFY_ROWS`` of a one-sequence step, become the rows ``logit_rows`` names (int64 ``[R]``): a
    step of several sequences computes the logits of each decode row and of each prompt chunk's last rows only."""
    if PAST_LEN not in graph.inputs:
        raise HeteroError(f"graph {graph.name!r} has no {PAST_LEN!r} input: not a one-sequence decoder graph")
    for node in graph.nodes:
        if node.name == LAST_TOKENS and node.op_type == "Slice":
            node.op_type, node.domain, node.attrs = "Gather", "", {"axis": 0}
            node.inputs = [node.inputs[0], LOGIT_ROWS]
            continue
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
    if any(node.inputs[1:] == [LOGIT_ROWS] for node in graph.nodes):
        graph.inputs.append(LOGIT_ROWS)
        graph.values[LOGIT_ROWS] = TensorInfo(dtypes.int64, (None,))


def feeds(ids: Sequence[int], positions: Sequence[int], slots: Sequence[int],
          logit_rows: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """A step's feeds: row t is token ``ids[t]`` of sequence ``slots[t]`` at ``positions[t]``; ``logit_rows`` (for a
    graph with that input) the rows whose logits it computes."""
    out = {INPUT_IDS: np.asarray(ids, dtype=np.int64), POSITIONS: np.asarray(positions, dtype=np.int64),
           SLOTS: np.asarray(slots, dtype=np.int64)}
    if logit_rows is not None:
        out[LOGIT_ROWS] = np.asarray(logit_rows, dtype=np.int64)
    return out


def sequence_feeds(slot: int, ids: Sequence[int], past: int) -> dict[str, np.ndarray]:
    """The feeds of a step of one sequence: ``ids`` at positions ``past ..`` of ``slot`` (its last rows' logits)."""
    n = len(ids)
    return feeds(ids, range(past, past + n), [slot] * n, range(n - min(n, VERIFY_ROWS), n))


@dataclass(eq=False)
class _Job:
    """One sequence's step waiting for a batch (one token: a decode row; several: a prompt chunk or a verify step),
    and then its result."""

    slot: int
    ids: list[int]
    past: int
    arrived: float = field(default_factory=time.monotonic)
    result: dict[str, np.ndarray] | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class BatchStats:
    """What a Batcher ran: ``steps`` (session runs), their ``rows`` (``decode_rows`` one-token steps,
    ``prompt_rows`` tokens of several-token ones), ``fused`` steps that carried both, ``isolated`` failed steps
    of several jobs run again one job at a time (only a job failing alone gets the error), ``run_seconds`` in the
    session and ``step_seconds`` from taking a batch to handing out its results (the difference: the batcher's own
    Python per step)."""

    steps: int = 0
    rows: int = 0
    decode_rows: int = 0
    prompt_rows: int = 0
    fused: int = 0
    isolated: int = 0  # failed steps of several jobs run again one job at a time
    run_seconds: float = 0.0
    step_seconds: float = 0.0


class Batcher:
    """Runs the steps of a model's sequences on its one session, one run at a time, as continuous batching: a step
    carries every waiting one-token (decode) step and, beside them, waiting several-token steps (prompt chunks) of
    up to ``budget`` tokens in all, each row at its own sequence and position — a new request's prompt is computed
    in the same run as the others' next tokens instead of stalling them. A step waits for the sequences of the
    previous one (at most ``window`` seconds for one that stopped without ``idle``), and a prompt that comes while
    nothing decodes waits ``gather`` seconds for others sent with it (their prompts then run in one step)."""

    def __init__(self, session: Session, slots: int, *, window: float = WINDOW, gather: float = GATHER,
                 budget: int = BUDGET, chunk: int = CHUNK, logit_rows: bool = True) -> None:
        self.session = session
        self.slots = slots
        self.window = window
        self.gather = gather
        self.budget = budget
        self.chunk = chunk  # a sequence's prompt runs in chunks of this many tokens (Llm._prefill)
        self.logit_rows = logit_rows  # the graph takes LOGIT_ROWS (else every row's logits come back)
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._decode: dict[int, _Job] = {}  # slot -> its waiting one-token step
        self._prompts: list[_Job] = []  # waiting several-token steps, oldest first
        self._expected: set[int] = set()  # the slots of the last step: the next one waits for them
        self._busy = False
        self._free_since = time.monotonic()

    @property
    def steps(self) -> int:
        return self.stats.steps

    @property
    def rows(self) -> int:
        return self.stats.rows

    def idle(self, slot: int) -> None:
        """Sequence ``slot`` takes no step for a while (its generation ended): steps stop waiting for it."""
        with self._cond:
            self._expected.discard(slot)
            self._cond.notify_all()

    def run(self, slot: int, ids: list[int], past: int, outputs: list[str]) -> dict[str, np.ndarray]:
        """Sequence ``slot``'s step of ``ids`` at positions ``past ..``; returns ``outputs``, its rows of each (the
        logits: the last ``min(len(ids), VERIFY_ROWS)``, as a one-sequence step gives them)."""
        job = _Job(slot, list(ids), past)
        with self._cond:
            if slot in self._decode or any(j.slot == slot for j in self._prompts):
                raise HeteroError(f"sequence {slot} already has a step waiting (one thread per sequence)")
            if len(job.ids) == 1:
                self._decode[slot] = job
            else:
                self._prompts.append(job)
            self._cond.notify_all()
            while not job.done:
                if not self._busy:
                    batch = self._take(time.monotonic())
                    if batch is not None:
                        self._busy = True
                        break
                    self._cond.wait(self._timeout())
                else:
                    self._cond.wait()
            else:
                return _result(job)
        self._lead(batch, outputs)  # this thread runs everyone's rows and hands each its own
        return _result(job)

    def run_rows(self, rows: Sequence[tuple[int, int, int]], outputs: list[str]) -> list[dict[str, np.ndarray]]:
        """One batched step of ``(slot, token, position)`` rows, now (waiting only for the session); returns each
        row's outputs, in order (or raises the error of the first row whose step failed)."""
        jobs = [_Job(slot, [token], position) for slot, token, position in rows]
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._busy = True
        self._lead(jobs, outputs)
        return [_result(job) for job in jobs]

    # -- internals ------------------------------------------------------------------------------------------------
    def _take(self, now: float) -> list[_Job] | None:
        """The next step's jobs if it should run now, else None (called with the lock held, the session free)."""
        if not self._decode and not self._prompts:
            return None
        waiting = self._decode.keys() | {job.slot for job in self._prompts}
        if len(waiting) < self.slots:  # else every sequence has its step here: nobody to wait for
            if self._expected or self._decode:  # sequences are decoding: wait for those of the last step
                if not self._expected <= waiting:
                    first = min(job.arrived for job in [*self._decode.values(), *self._prompts])
                    if now < max(first, self._free_since) + self.window:
                        return None
            elif now < min(max(job.arrived for job in self._prompts) + self.gather,
                           self._prompts[0].arrived + 3 * self.gather):
                return None  # only new prompts: others sent at the same moment may be on their way
        batch = [self._decode.pop(slot) for slot in sorted(self._decode)]
        tokens = 0
        while self._prompts and (tokens == 0 or tokens + len(self._prompts[0].ids) <= self.budget):
            tokens += len(self._prompts[0].ids)
            batch.append(self._prompts.pop(0))
        return batch

    def _timeout(self) -> float | None:
        """How long a waiting thread sleeps before checking again (called with the lock held)."""
        jobs = [*self._decode.values(), *self._prompts]
        if not jobs:
            return None
        first = min(job.arrived for job in jobs)
        if self._expected or self._decode:
            deadline = max(first, self._free_since) + self.window
        else:
            deadline = min(max(job.arrived for job in self._prompts) + self.gather, first + 3 * self.gather)
        return max(deadline - time.monotonic(), 1e-3)

    def _lead(self, batch: list[_Job], outputs: list[str]) -> None:
        """Runs ``batch`` as one step (the session is this thread's) and hands each job its rows. A step that fails
        is run again one job at a time: the sequences whose own step works get their rows, and only a job whose step
        fails alone gets the error (a state is rewritten at explicit positions, so a run again is the same run)."""
        started = time.perf_counter()
        try:
            try:
                self._step(batch, outputs)
            except Exception:
                if len(batch) == 1:
                    raise
                self.stats.isolated += 1
                for job in batch:
                    try:
                        self._step([job], outputs)
                    except Exception as own:
                        job.error = own
        except BaseException as exc:  # every job of a step that failed alone, or interrupted, gets its error
            for job in batch:
                if job.result is None and job.error is None:
                    job.error = exc
        finally:
            with self._cond:
                for job in batch:
                    job.done = True
                self._busy = False
                self._free_since = time.monotonic()
                self._expected = {job.slot for job in batch}
                self.stats.step_seconds += time.perf_counter() - started
                self._cond.notify_all()

    def _step(self, batch: list[_Job], outputs: list[str]) -> None:
        """One run of the session carrying ``batch``'s rows; each job gets its rows of the outputs."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        picks: list[int] = []
        spans = []  # per job: its rows [a, b) and its logits rows [pa, pb) among the picks
        for job in batch:
            a, n = len(ids), len(job.ids)
            ids.extend(job.ids)
            positions.extend(range(job.past, job.past + n))
            slots.extend([job.slot] * n)
            pa = len(picks)
            picks.extend(range(a + n - min(n, VERIFY_ROWS), a + n))
            spans.append((a, a + n, pa, len(picks)))
        ran = time.perf_counter()
        out = self.session.run(feeds(ids, positions, slots, picks if self.logit_rows else None), outputs)
        self._count(batch, len(ids), time.perf_counter() - ran)
        total, picked = len(ids), len(picks)
        for job, (a, b, pa, pb) in zip(batch, spans, strict=True):
            # an output of every row (a layer's) or of the picked rows only (the logits, the final norm's)
            job.result = {name: value[a:b] if value.shape[0] == total or picked == total else value[pa:pb]
                          for name, value in out.items()}

    def _count(self, batch: list[_Job], rows: int, seconds: float) -> None:
        stats = self.stats
        decode = sum(len(job.ids) == 1 for job in batch)
        stats.steps += 1
        stats.rows += rows
        stats.decode_rows += decode
        stats.prompt_rows += rows - decode
        stats.fused += bool(decode and rows > decode)
        stats.run_seconds += seconds


def _result(job: _Job) -> dict[str, np.ndarray]:
    if job.error is not None:
        raise job.error
    assert job.result is not None
    return job.result


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
        outs = batcher.run_rows(list(zip(slots, [int(t) for t in tokens], pasts, strict=True)), wanted)
        rows = []
        for seq, token, past, out in zip(sequences, tokens, pasts, outs, strict=True):
            seq._owner = None
            rows.append(seq._took([int(token)], past, out))
        return np.concatenate(rows)
    finally:
        for lock in reversed(locks):
            lock.release()


__all__ = ["LOGIT_ROWS", "POSITIONS", "SLOTS", "BatchStats", "Batcher", "decode_step", "slot_graph"]
