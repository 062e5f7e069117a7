"""A decode step as one native call (``hetero_cpu.fuse.step_calls`` / ``_native.LlmStep``): the merged step writes
exactly what its calls write, at any thread count; a refused range check runs the original calls (their error);
calls native code cannot take stay calls of their own; a whole model's replayed decode is a handful of calls with
the logits of the unmerged step."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from hetero.contract import HeteroError, quant  # noqa: E402
from hetero_cpu import fuse  # noqa: E402
from hetero_cpu.kernels.llm import AttentionCall  # noqa: E402

from .conftest import thread_counts  # noqa: E402

H, HEADS, KV_HEADS, D, INTER = 256, 4, 2, 64, 512


threads = thread_counts(1, 2, 3)


def _weights(n: int, k: int, seed: int):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    fmt = quant.parse_quant("q4")
    return _native.llm_weights(quant.quantize(w, fmt).reshape(n, -1), fmt.wtype, fmt.block_size, fmt.symmetric, k)


def _layer(past: np.ndarray, cache, context: int = 32):
    """A Qwen3 decoder layer's bound calls for one token, as the replay holds them after ``fuse_calls``: norm,
    q / k / v, per-head q / k norms, rotary on q and k, attention, o + residual, norm, gate / up / SwiGLU, down +
    residual."""
    r = np.random.default_rng(3)
    ws = {name: _weights(n, k, seed=i) for i, (name, n, k) in enumerate(
        [("q", HEADS * D, H), ("k", KV_HEADS * D, H), ("v", KV_HEADS * D, H), ("o", H, HEADS * D),
         ("gate", INTER, H), ("up", INTER, H), ("down", H, INTER)])}
    buf = {name: np.zeros((1, n), np.float32) for name, n in
           [("h0", H), ("x", H), ("q", HEADS * D), ("k", KV_HEADS * D), ("v", KV_HEADS * D), ("qn", HEADS * D),
            ("kn", KV_HEADS * D), ("qr", HEADS * D), ("kr", KV_HEADS * D), ("att", HEADS * D), ("o", H),
            ("h1", H), ("x2", H), ("g", INTER), ("u", INTER), ("act", INTER), ("d", H)]}
    buf["h0"][:] = r.standard_normal((1, H))
    scale, hscale = ((1 + 0.1 * r.standard_normal(n)).astype(np.float32) for n in (H, D))
    rope = _native.LlmRope(1.0 / 10000 ** (np.arange(0, D, 2) / D), 1.0)
    heads = {name: buf[name].reshape(1, -1, D) for name in ("q", "k", "v", "qn", "kn", "qr", "kr", "att")}
    mm = functools.partial
    program = [
        mm(_native.rms_norm, buf["h0"], scale, buf["x"], 1e-6),
        mm(_native.llm_matmul_multi, [ws["q"], ws["k"], ws["v"]], buf["x"], [buf["q"], buf["k"], buf["v"]],
           [None, None, None]),
        mm(_native.rms_norm, buf["q"].reshape(-1, D), hscale, buf["qn"].reshape(-1, D), 1e-6),
        mm(_native.rms_norm, buf["k"].reshape(-1, D), hscale, buf["kn"].reshape(-1, D), 1e-6),
        mm(rope, heads["qn"], heads["qr"], past),
        mm(rope, heads["kn"], heads["kr"], past),
        AttentionCall(cache, heads["qr"], heads["kr"], heads["v"], past, 1 / np.sqrt(D), heads["att"], context,
                      "Attention(layer0)"),
        mm(_native.llm_matmul_residual, ws["o"], buf["att"], buf["o"], None, buf["h0"], buf["h1"]),
        mm(_native.rms_norm, buf["h1"], scale, buf["x2"], 1e-6),
        mm(_native.llm_matmul_swiglu, ws["gate"], ws["up"], buf["x2"], buf["g"], buf["u"], buf["act"], None, None),
        mm(_native.llm_matmul_residual, ws["down"], buf["act"], buf["d"], None, buf["h1"], buf["h1"]),
    ]
    return program, buf


def _decode(program, buf, past: np.ndarray, steps: int = 3) -> list[dict[str, np.ndarray]]:
    """Runs ``program`` at positions 0, 1, ... (the cache fills as it goes)."""
    h0 = buf["h0"].copy()
    results = []
    for pos in range(steps):
        past[0] = pos
        buf["h0"][:] = h0 + pos
        for name, b in buf.items():
            if name != "h0":
                b[:] = np.nan
        for call in program:
            call()
        results.append({name: b.copy() for name, b in buf.items()})
    return results


def test_a_decoder_layer_is_one_native_call_with_the_same_results(threads):
    runs = []
    for merge in (False, True):
        past = np.zeros(1, np.int64)
        cache = _native.LlmAttention(KV_HEADS, D, 32, "f16")
        program, buf = _layer(past, cache)
        if merge:
            program = fuse.step_calls(program)
            assert len(program) == 1 and isinstance(program[0], _native.LlmStep) and len(program[0]) == 11
        runs.append(_decode(program, buf, past))
        assert cache.filled == 3
    for got, want in zip(runs[1], runs[0], strict=True):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _timed_step_matches_untimed(configure) -> object:
    """Decodes the fixture layer as one merged step twice, untimed and with ``configure(step)`` switching timing on;
    checks the outputs are equal and returns the timed step (its accounts still to take)."""
    runs, steps = [], []
    for timed in (False, True):
        past = np.zeros(1, np.int64)
        cache = _native.LlmAttention(KV_HEADS, D, 32, "f16")
        program, buf = _layer(past, cache)
        step = fuse.step_calls(program)[0]
        if timed:
            configure(step)
        runs.append(_decode([step], buf, past))
        steps.append(step)
    for got, want in zip(runs[1], runs[0], strict=True):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return steps[1]


@pytest.mark.parametrize("cpu", [False, True])
def test_timing_splits_the_step_per_op_and_changes_no_result(cpu):
    """``timing`` (wall clock, or the process's CPU time with ``timing_cpu``) sums one time and one pool account per
    op over the steps run (``take_times`` resets them); the outputs are those of the untimed step."""

    def configure(step) -> None:
        step.timing, step.timing_cpu = True, cpu

    step = _timed_step_matches_untimed(configure)
    times = step.take_times()
    assert len(times) == len(step) == 11
    assert all(t >= 0 and "calls" in st for t, st in times) and sum(t for t, _ in times) > 0
    assert sum(t for t, _ in step.take_times()) == 0


def test_clean_timing_keeps_runs_and_changes_no_result():
    """``timing_clean`` (with wall-clock ``timing``) also keeps, per op, the wall time of each run during which
    every pool thread ran (``take_clean``: [(runs, pool account of them)], reset by the take); ``pool_cpu_ns``
    gives the caller's and each worker's CPU time. Which runs are clean depends on the machine's load, so only
    the form is checked, and that the outputs are the untimed step's."""
    threads = _native.num_threads()
    try:
        _native.set_num_threads(2)
        clocks = _native.pool_cpu_ns()
        assert len(clocks) == 2 and clocks[0] > 0
        assert all(b >= a for a, b in zip(clocks, _native.pool_cpu_ns(), strict=True) if a >= 0)

        def configure(step) -> None:
            step.timing = step.timing_clean = True

        step = _timed_step_matches_untimed(configure)
        clean = step.take_clean()
        assert len(clean) == len(step)
        for op_runs, st in clean:
            assert all(t > 0 for t in op_runs) and "joins" in st
            assert st["joins"] >= st["calls"]  # a clean pooled region was joined by the worker
        assert all(not r for r, _ in step.take_clean())
    finally:
        _native.set_num_threads(threads)


def test_a_refused_range_check_runs_the_original_calls():
    past = np.zeros(1, np.int64)
    cache = _native.LlmAttention(KV_HEADS, D, 32, "f16")
    program, buf = _layer(past, cache)
    step = fuse.step_calls(program)[0]
    past[0] = 5  # nothing cached: the attention call refuses it
    with pytest.raises(HeteroError, match=r"Attention\(layer0\)"):
        step()
    assert cache.filled == 0
    # the calls before the attention ran (as unmerged), the ones after did not
    assert np.isfinite(buf["qr"]).all() and not buf["h1"].any()
    past[0] = -1  # the rotary refuses a negative position: its own error
    with pytest.raises(ValueError, match="llm_rope: past_len must be >= 0"):
        step()
    past[0] = 0
    assert step() is True and cache.filled == 1


def test_calls_native_code_cannot_take_stay_apart():
    past = np.zeros(1, np.int64)
    program, buf = _layer(past, _native.LlmAttention(KV_HEADS, D, 32, "f16"))
    odd = np.zeros((1, 2 * H), np.float32)[:, ::2]  # a strided rms_norm input: the step refuses it
    program[8] = functools.partial(_native.rms_norm, odd, program[8].args[1], buf["x2"], 1e-6)
    program.insert(3, functools.partial(_native.topk, buf["q"], 1, 1, True, np.zeros((1, 1), np.float32),
                                        np.zeros((1, 1), np.int64)))  # no step op
    merged = fuse.step_calls(program)
    assert [len(c) if isinstance(c, _native.LlmStep) else c for c in merged] == [3, program[3], 5, program[9], 2]
    assert fuse.step_calls([]) == [] and fuse.step_calls(program[:1]) == program[:1]
    step = _native.LlmStep()
    with pytest.raises(ValueError, match="cache must be an LlmAttention"):
        step.add_attention(object(), buf["q"], buf["k"], buf["v"], past, 1.0, buf["att"])
    with pytest.raises(ValueError, match="past_len must be a one-element int64 array"):
        step.add_rope(program[5].func, *program[5].args[:2], past.astype(np.int32))
    assert len(step) == 0


def test_whole_decode_step_in_a_few_calls_and_logits_unchanged(monkeypatch):
    """The tiny synthetic Qwen3 (q4): the replayed decode step is a handful of calls, one of them an LlmStep with
    every decoder layer, and its logits equal those of the unmerged calls (the embedding and the LM head's
    ``_run_dynamic`` stay Python calls)."""
    from hetero.llm.synthetic import load_synthetic
    from hetero.runtime.executor import KernelProgram

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load_synthetic("tiny", "q4", backends=["cpu"], on_fallback="silent", threads=2, context=32,
                             progress=False)

    def decode() -> list[np.ndarray]:
        llm.reset()
        llm.prefill([1, 2, 3, 4])
        return [np.array(llm.forward([t])) for t in (5, 6, 7, 8, 9)]  # the replay is recorded by the 2nd/3rd

    on = decode()
    replays = [p.replay for p in llm.session.programs if isinstance(p, KernelProgram) and p.replay is not None]
    steps = [c for r in replays for c in r.program if isinstance(c, _native.LlmStep)]
    assert replays and len(replays[0].program) <= 6
    # every decoder layer's 11 calls in one (norm, q/k/v, q/k norms, 2 rotary, attention, o + add, norm,
    # gate/up/SwiGLU, down + add); the final norm and the LM head may form another
    assert max(len(s) for s in steps) >= 11 * llm.config.num_layers
    llm.session.invalidate_replay()
    monkeypatch.setenv("HETERO_CPU_STEP", "0")
    off = decode()
    for a, b in zip(on, off, strict=True):
        np.testing.assert_array_equal(a, b)
