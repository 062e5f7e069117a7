"""Continuous batching (hetero.llm.batch): several sequences of one model decoded as one batched step give, token
for token, what each gives decoded alone — on every fixture family, on cpu and on the reference; slots freed and
reused, a slot joining mid-run, threads gathered by the batcher, and the several-sequence form falling back from
backends that do not implement it."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from conftest import backend_ok
from hetero.contract import HeteroError
from hetero.contract.opforms import SlotRun, slot_runs
from hetero.llm.batch import decode_step

from .helpers import FIXTURES, load

FAMILIES = ["qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe"]
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [30]]
STEPS = 6


def _alone(llm, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and their logits rows, the sequence decoded by itself."""
    llm.reset()
    row = llm.prefill(prompt)[-1]
    tokens, rows = [], []
    for _ in range(steps):
        tokens.append(int(np.argmax(row)))
        row = llm.forward([tokens[-1]])[-1]
        rows.append(row)
    return tokens, rows


@pytest.fixture(scope="module", params=["cpu", "reference"])
def backend(request) -> str:
    return request.param


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_greedy_decode_equals_each_sequence_alone(family, backend):
    alone = load(FIXTURES / family, backends=[backend])
    multi = load(FIXTURES / family, backends=[backend], slots=len(PROMPTS))
    want = [_alone(alone, p, STEPS) for p in PROMPTS]
    seqs = multi.sequences()
    assert seqs[0] is multi and len({id(s) for s in seqs}) == len(PROMPTS)
    rows = [s.prefill(p)[-1] for s, p in zip(seqs, PROMPTS, strict=True)]  # different lengths: positions differ
    got: list[list[int]] = [[] for _ in PROMPTS]
    for step in range(STEPS):
        tokens = [int(np.argmax(r)) for r in rows]
        for g, t in zip(got, tokens, strict=True):
            g.append(t)
        rows = list(decode_step(seqs, tokens))
        for i, row in enumerate(rows):
            if backend == "cpu":  # each row's sums run in the same order as alone: bit for bit
                np.testing.assert_array_equal(row, want[i][1][step])
            else:  # numpy's matmul of B rows may sum in another order
                np.testing.assert_allclose(row, want[i][1][step], rtol=0, atol=1e-4)
    assert got == [w[0] for w in want]
    for seq, prompt, tokens in zip(seqs, PROMPTS, got, strict=True):
        assert seq.tokens == prompt + tokens


def test_a_freed_slot_is_reused_and_a_slot_joins_mid_run():
    alone = load(FIXTURES / "qwen3_5", backends=["cpu"])
    multi = load(FIXTURES / "qwen3_5", backends=["cpu"], slots=3)
    a, b, c = multi.sequences()
    want = {tuple(p): _alone(alone, p, 8)[0] for p in PROMPTS}

    def run(pairs: dict, steps: int) -> None:
        for _ in range(steps):
            seqs = list(pairs)
            rows = decode_step(seqs, [pairs[s][-1] for s in seqs])
            for s, row in zip(seqs, rows, strict=True):
                pairs[s].append(int(np.argmax(row)))

    first = {a: [int(np.argmax(a.prefill(PROMPTS[0])[-1]))], b: [int(np.argmax(b.prefill(PROMPTS[1])[-1]))]}
    run(first, 3)
    first[c] = [int(np.argmax(c.prefill(PROMPTS[2])[-1]))]  # joins while a and b are mid-run
    run(first, 4)
    assert first[a] == want[tuple(PROMPTS[0])][:8] and first[b] == want[tuple(PROMPTS[1])][:8]
    assert first[c] == want[tuple(PROMPTS[2])][:5]
    b.reset()  # b's request is over: the slot takes a new sequence while a and c go on
    pairs = {a: first[a], c: first[c], b: [int(np.argmax(b.prefill(PROMPTS[3])[-1]))]}
    run(pairs, 3)
    assert pairs[b] == want[tuple(PROMPTS[3])][:4]
    assert pairs[c] == want[tuple(PROMPTS[2])][:8]
    assert b.tokens == PROMPTS[3] + pairs[b][:-1]


def test_threads_generating_on_the_sequences_are_batched_and_get_their_own_text():
    alone = load(FIXTURES / "qwen3", backends=["cpu"])
    multi = load(FIXTURES / "qwen3", backends=["cpu"], slots=4)
    multi._batch.window = 2.0  # a loaded machine may delay a thread past the 50 ms default: wait for it here
    prompts = ["hello there", "the cat sat on the mat", "one two three", "x"]
    want = [alone.generate(p, max_new_tokens=16, temperature=0.8, seed=3) for p in prompts]
    got: list = [None] * len(prompts)
    errors: list = []

    def generate(i: int) -> None:
        seq = multi.sequence(i)
        try:
            got[i] = seq.generate(prompts[i], max_new_tokens=16, temperature=0.8, seed=3)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            seq.idle()

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and got == want
    batcher = multi._batch
    assert batcher.rows > 2 * batcher.steps, (batcher.rows, batcher.steps)  # the one-token steps went together
    for i, seq in enumerate(multi.sequences()):
        assert seq.last.text == want[i] and seq.stats.generated_tokens == 16


def test_bad_slots_and_steps_are_refused():
    with pytest.raises(HeteroError, match="slots=0"):
        load(FIXTURES / "qwen3", slots=0)
    with pytest.raises(HeteroError, match="slots=17"):
        load(FIXTURES / "qwen3", slots=17)
    multi = load(FIXTURES / "qwen3", backends=["cpu"], slots=2, context=8)
    other = load(FIXTURES / "qwen3", backends=["cpu"], slots=2)
    with pytest.raises(HeteroError, match="slot 2"):
        multi.sequence(2)
    a, b = multi.sequences()
    with pytest.raises(HeteroError, match="appears twice"):
        decode_step([a, a], [1, 2])
    with pytest.raises(HeteroError, match="one model"):
        decode_step([a, other.sequence(1)], [1, 2])
    with pytest.raises(HeteroError, match="one each"):
        decode_step([a, b], [1])
    a.prefill([1, 2, 3, 4, 5, 6, 7, 8])
    b.prefill([1, 2])
    with pytest.raises(HeteroError, match="exceed the context"):  # checked before anything runs
        decode_step([b, a], [3, 9])
    assert b.tokens == [1, 2] and len(a.tokens) == 8
    with pytest.raises(HeteroError, match="fixed at load"):
        multi.expose_hidden([0])


def test_a_lone_sequence_decodes_as_on_a_one_sequence_model_and_bad_rows_are_refused():
    """A one-row step (a lone stream) takes the attention's one-row call: bit for bit the one-sequence model's,
    on any slot, and a row at a position its slot's cache does not reach, or on no slot, is refused by name."""
    alone = load(FIXTURES / "qwen2", backends=["cpu"])
    multi = load(FIXTURES / "qwen2", backends=["cpu"], slots=3)
    tokens, rows = _alone(alone, PROMPTS[2], STEPS)
    for slot in (2, 0):
        seq = multi.sequence(slot)
        got, _ = _alone(seq, PROMPTS[2], STEPS)
        assert got == tokens
        seq.rollback(len(PROMPTS[2]) + STEPS - 1)  # the last step again, alone on the model
        np.testing.assert_array_equal(seq.forward([tokens[-1]])[-1], rows[-1])
    replays = [plan.replay for program in multi.session.programs for plan in getattr(program, "_plans", {}).values()
               if plan.replay is not None]
    merged = [sum(type(call).__name__ == "LlmStep" for call in r.program) for r in replays]
    if os.environ.get("HETERO_CPU_STEP", "1") != "0":  # the lone row's step merged as a one-sequence one's
        assert max(merged) >= 1 and min(len(r.program) for r in replays) < 10
    batcher, wanted = multi._batch, multi._step_outputs()
    with pytest.raises(HeteroError, match="past_len 40 is outside the 0 cached positions"):
        batcher.run_rows([(1, 5, 40)], wanted)  # slot 1 holds nothing yet
    with pytest.raises(HeteroError, match="slot 3 is not one of the node's 3"):
        batcher.run_rows([(3, 5, 0)], wanted)
    got, _ = _alone(multi.sequence(1), PROMPTS[2], STEPS)  # the model is fine after the refused steps
    assert got == tokens


def test_slot_runs_cut_rows_into_one_sequence_runs():
    runs = slot_runs("n", np.array([5, 6, 7, 0, 3, 4, 9]), np.array([0, 0, 0, 1, 2, 2, 0]), 3)
    assert runs == (SlotRun(0, 0, 3, 5), SlotRun(1, 3, 4, 0), SlotRun(2, 4, 6, 3), SlotRun(0, 6, 7, 9))
    assert slot_runs("n", np.array([4, 5, 9]), None, 1) == (SlotRun(0, 0, 2, 4), SlotRun(0, 2, 3, 9))
    assert slot_runs("n", np.zeros(0, np.int64), np.zeros(0, np.int64), 1) == ()
    with pytest.raises(HeteroError, match="n: slot 3 is not one of the node's 3"):
        slot_runs("n", np.array([0]), np.array([3]), 3)
    with pytest.raises(HeteroError, match="one per row"):
        slot_runs("n", np.array([0, 1]), np.array([0]), 3)


def test_backends_without_the_batched_form_fall_back_to_cpu():
    ok, why = backend_ok("opencl")
    if not ok:
        pytest.skip(why)
    alone = load(FIXTURES / "qwen3", backends=["cpu"])
    multi = load(FIXTURES / "qwen3", backends=["opencl", "cpu"], slots=2)
    placed = {p.backend for p in multi.session.placement.nodes if p.op_type in ("Attention", "RotaryEmbedding")}
    assert placed == {"cpu"}
    assert "opencl" in multi.session.placement.counts()  # the rest (matmuls, norms) stays on opencl
    want = [_alone(alone, p, 4)[0] for p in PROMPTS[:2]]
    seqs = multi.sequences()
    rows = [s.prefill(p)[-1] for s, p in zip(seqs, PROMPTS[:2], strict=True)]
    got: list[list[int]] = [[], []]
    for _ in range(4):
        tokens = [int(np.argmax(r)) for r in rows]
        for g, t in zip(got, tokens, strict=True):
            g.append(t)
        rows = list(decode_step(seqs, tokens))
    assert got == want


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_slots_state_exports_and_imports_into_another_slot(family):
    """hetero.llm.snapshot (the server's prefix cache) on a model of several sequences: each slot's own state."""
    from hetero.llm import snapshot

    alone = load(FIXTURES / family, backends=["cpu"])
    want = _alone(alone, PROMPTS[2], 3)[0]
    multi = load(FIXTURES / family, backends=["cpu"], slots=3)
    a, b, c = multi.sequences()
    b.prefill(PROMPTS[0])  # another sequence's state, which the export must not take
    a.prefill(PROMPTS[1])
    c.prefill(PROMPTS[2])
    snap = snapshot.export(c, 2, len(PROMPTS[2]))
    c.prefill(PROMPTS[3])  # slot 2 moves on to another sequence
    snapshot.restore(b, 1, snap, len(PROMPTS[2]))
    b.tokens = list(PROMPTS[2])
    row = b.forward([want[0]])[-1]
    assert int(np.argmax(row)) == want[1]
    with pytest.raises(HeteroError, match="slot 3"):
        snapshot.export(c, 3, 1)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "qwen3_moe"])
def test_a_prompt_arriving_mid_decode_is_fused_into_the_others_steps(family):
    """Continuous batching: a new sequence's prompt chunks run in the same steps as the decoding sequences' next
    tokens (rows of several sequences and positions in one run), and every sequence still gets, token for token,
    what it gets alone (greedy) — the decoding ones, and the one whose prompt went in pieces beside them."""
    alone = load(FIXTURES / family, backends=["cpu"])
    prompts = [PROMPTS[0], PROMPTS[1], [(7 * i) % 50 + 1 for i in range(37)]]
    want = [_alone(alone, p, 12)[0] for p in prompts]
    multi = load(FIXTURES / family, backends=["cpu"], slots=3)
    batcher = multi._batch
    batcher.window = 5.0  # wait for every sequence of the last step, however loaded the machine
    batcher.chunk = 8  # the 37-token prompt: 5 chunks, each fused into a decode step of the other two
    seqs = multi.sequences()
    got: list = [None] * 3
    started = threading.Event()
    errors: list = []

    def decode(i: int) -> None:
        seq = seqs[i]
        try:
            tokens = [int(np.argmax(seq.prefill(prompts[i])[-1]))]
            for step in range(11):
                if step == 2 and i == 0:
                    started.set()  # the others decode: the third sequence's prompt comes now
                if step == 3 and i == 0:
                    # and is queued before the next decode step (on a loaded machine the two could otherwise finish
                    # before the late thread runs: nothing to fuse); sequence 1 waits for 0 (the window)
                    deadline = time.monotonic() + 60
                    while not batcher._prompts and time.monotonic() < deadline:
                        time.sleep(1e-3)
                tokens.append(int(np.argmax(seq.forward([tokens[-1]])[-1])))
            got[i] = tokens
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            seq.idle()

    def late() -> None:
        started.wait(60)
        decode(2)

    threads = [threading.Thread(target=decode, args=(0,)), threading.Thread(target=decode, args=(1,)),
               threading.Thread(target=late)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert got == want
    stats = batcher.stats
    assert stats.fused >= 3, stats  # the prompt's chunks went with the others' decode rows
    assert stats.prompt_rows >= 37 and stats.decode_rows >= 3 * 11, stats
    assert seqs[2].tokens == prompts[2] + want[2][:-1]


def test_prompts_sent_together_are_prefilled_in_one_step():
    """Requests that come at once while nothing decodes: their prompts run in one step (the gather window), then
    their decode rows go together; each gets what it gets alone."""
    alone = load(FIXTURES / "qwen3", backends=["cpu"])
    want = [_alone(alone, p, 5)[0] for p in PROMPTS[:3]]
    multi = load(FIXTURES / "qwen3", backends=["cpu"], slots=3)
    batcher = multi._batch
    batcher.window = batcher.gather = 5.0  # all three are waited for, however loaded the machine
    seqs = multi.sequences()
    got: list = [None] * 3
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait()
        tokens = [int(np.argmax(seqs[i].prefill(PROMPTS[i])[-1]))]
        for _ in range(4):
            tokens.append(int(np.argmax(seqs[i].forward([tokens[-1]])[-1])))
        got[i] = tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == want
    stats = batcher.stats
    # one step of the three prompts (5 + 3 + 11 rows), then four steps of three decode rows
    assert (stats.steps, stats.prompt_rows, stats.decode_rows) == (5, 19, 12), stats
