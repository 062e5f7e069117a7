"""The decode step's fused matmuls (llm_matmul_multi / _swiglu / _residual) and the replay fuser (hetero_cpu.fuse):
a fused call equals the unfused calls bit for bit, at any thread count, in the fast path (one row, a batched step's
few rows, a speculative verify step's up to 16: one or two row tiles per weight group) and the fallback (more rows,
float weights), and the fuser only merges calls whose merge cannot change a result."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

from hetero.contract import quant  # noqa: E402
from hetero_cpu import fuse  # noqa: E402

from .conftest import thread_counts  # noqa: E402

K = 256


def _weights(spec: str, n: int, k: int = K, seed: int = 0):
    r = np.random.default_rng(seed)
    if spec in quant.GGML_FORMATS:
        fmt = quant.GGML_FORMATS[spec]
        raw = r.integers(0, 256, (n, fmt.blocks(k), fmt.block_bytes), dtype=np.uint8)
        for at in fmt.f16_fields:
            scales = (r.standard_normal((n, fmt.blocks(k))) * 0.02).astype(np.float16)
            raw[..., at:at + 2] = scales[..., None].view(np.uint8)
        return _native.llm_weights(raw.reshape(n, fmt.row_bytes(k)), spec, k=k)
    w = r.standard_normal((n, k)).astype(np.float32)
    if spec == "f16":
        return _native.llm_weights(w.astype(np.float16), "f16", k=k)
    fmt = quant.parse_quant(spec)
    return _native.llm_weights(quant.quantize(w, fmt).reshape(n, -1), fmt.wtype, fmt.block_size, fmt.symmetric, k)


def _x(m: int, k: int = K, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


threads = thread_counts(1, 2, 3)


# A Q4_K_M-like projection set: q / k in q4_k, v in q6_k (two activation formats in one call), and plain q4 / q8.
@pytest.mark.parametrize("specs", [("q4", "q4", "q4"), ("q4_k", "q4_k", "q6_k"), ("q8", "q4_asym", "f16")])
@pytest.mark.parametrize("m", [1, 3, 4, 8, 9, 12, 16, 17])
def test_matmul_multi_equals_separate_calls(threads, specs, m):
    ns = (1000, 256, 37)  # row counts off the 16-row group size
    ws = [_weights(s, n, seed=i) for i, (s, n) in enumerate(zip(specs, ns, strict=True))]
    biases = [None, np.linspace(-1, 1, ns[1], dtype=np.float32), None]
    x = _x(m)
    want = []
    for w, n, b in zip(ws, ns, biases, strict=True):
        out = np.empty((m, n), np.float32)
        _native.llm_matmul(w, x, out, b)
        want.append(out)
    got = [np.full((m, n), np.nan, np.float32) for n in ns]
    _native.llm_matmul_multi(ws, x, got, biases)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("spec", ["q4", "q4_k", "q8"])
@pytest.mark.parametrize("n,m", [(1024, 1), (1000, 1), (1024, 5), (1000, 4), (1000, 9), (1000, 13), (1000, 17)])
def test_matmul_swiglu_equals_matmuls_then_swiglu(threads, spec, n, m):
    wg, wu = _weights(spec, n, seed=2), _weights(spec, n, seed=3)
    bu = np.linspace(-1, 1, n, dtype=np.float32)
    x = _x(m)
    g, u, want = (np.empty((m, n), np.float32) for _ in range(3))
    _native.llm_matmul(wg, x, g)
    _native.llm_matmul(wu, x, u, bu)
    _native.llm_swiglu(g, u, want)
    g2, u2, got = (np.full((m, n), np.nan, np.float32) for _ in range(3))
    _native.llm_matmul_swiglu(wg, wu, x, g2, u2, got, None, bu)
    np.testing.assert_array_equal(g2, g)
    np.testing.assert_array_equal(u2, u)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("spec", ["q4", "q6_k", "f16"])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("m", [1, 2, 4, 9, 16, 17])
def test_matmul_residual_equals_matmul_then_add(threads, spec, in_place, m):
    n = 1040
    w = _weights(spec, n, seed=4)
    x = _x(m)
    h = _x(m, n, seed=5)
    out, want = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    _native.llm_matmul(w, x, out, None)
    _native.binary("add", h, out, want)
    out2 = np.full((m, n), np.nan, np.float32)
    res_out = h.copy() if in_place else np.full((m, n), np.nan, np.float32)
    residual = res_out if in_place else h
    _native.llm_matmul_residual(w, x, out2, None, residual, res_out)
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(res_out, want)


def _np_argmax_rows(y: np.ndarray) -> np.ndarray:
    return np.array([int(np.argmax(row)) for row in y], dtype=np.int64)


@pytest.mark.parametrize("spec", ["q4", "q5_0", "q4_k", "q8", "f16"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 5003])
@pytest.mark.parametrize("m", [1, 2, 9, 16, 17])
def test_matmul_argmax_equals_matmul_then_numpy_argmax(threads, spec, n, m):
    """The LM head with the greedy token: the logits are llm_matmul's bits, best is numpy's argmax of each row, with
    row counts off the group and vector sizes (a tail group, a tail vector), float weights' fallback and > 16 rows."""
    w = _weights(spec, n, seed=6)
    bias = np.linspace(-0.5, 0.5, n, dtype=np.float32) if n % 2 else None
    x = _x(m)
    want = np.empty((m, n), np.float32)
    _native.llm_matmul(w, x, want, bias)
    got = np.full((m, n), np.nan, np.float32)
    best = np.full(m, -7, np.int64)
    _native.llm_matmul_argmax(w, x, got, bias, best)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(best, _np_argmax_rows(want))


def test_matmul_argmax_ties_nan_and_infinities(threads):
    """Ties break to the first index and a NaN wins at its first index, as numpy's argmax, wherever they fall
    against the tasks' column ranges: rows made by weight rows that repeat (equal logits), a bias of NaN / +-inf at
    chosen columns."""
    n, k = 4099, K
    r = np.random.default_rng(8)
    base = r.standard_normal((64, k)).astype(np.float32)
    rows = base[r.integers(0, 64, n)]  # every logit equal to ~n / 64 others: ties of the maximum across tasks
    w = _native.llm_weights(rows.astype(np.float16), "f16", k=k)
    fmt = quant.parse_quant("q8")
    wq = _native.llm_weights(quant.quantize(rows, fmt).reshape(n, -1), fmt.wtype, fmt.block_size, fmt.symmetric, k)
    x = _x(3)
    cases = {"ties": None}
    for at in ((5,), (4000,), (2047, 3000), (n - 1,)):
        b = np.zeros(n, np.float32)
        b[list(at)] = np.nan
        cases[f"nan{at}"] = b
    b = np.zeros(n, np.float32)
    b[[17, 3001]] = np.inf
    cases["inf"] = b
    cases["-inf"] = np.full(n, -np.inf, np.float32)
    b = np.full(n, -np.inf, np.float32)
    b[2500] = np.nan
    cases["-inf nan"] = b
    for name, bias in cases.items():
        for weights in (w, wq):
            want = np.empty((3, n), np.float32)
            _native.llm_matmul(weights, x, want, bias)
            got, best = np.empty((3, n), np.float32), np.empty(3, np.int64)
            _native.llm_matmul_argmax(weights, x, got, bias, best)
            np.testing.assert_array_equal(got, want, err_msg=name)
            np.testing.assert_array_equal(best, _np_argmax_rows(want), err_msg=name)
            if name == "ties":
                assert all((want[i] == want[i, best[i]]).sum() > 1 for i in range(3))  # the ties are real


def test_fused_calls_check_their_arguments():
    w4, w8 = _weights("q4", 64), _weights("q4", 64, k=128)
    x = _x(1)
    with pytest.raises(ValueError, match="llm_matmul_multi: weights, outs and biases"):
        _native.llm_matmul_multi([w4], x, [], [None])
    with pytest.raises(ValueError, match="llm_matmul_multi: x's last dim must be K"):
        _native.llm_matmul_multi([w4, w8], x, [np.empty((1, 64), np.float32)] * 2, [None, None])
    with pytest.raises(ValueError, match="llm_matmul_swiglu: gate and up weights must have one shape"):
        _native.llm_matmul_swiglu(w4, w8, x, *(np.empty((1, 64), np.float32) for _ in range(3)))
    with pytest.raises(ValueError, match="llm_matmul_residual: out, residual and res_out"):
        _native.llm_matmul_residual(w4, x, np.empty((1, 64), np.float32), None, np.empty((1, 63), np.float32),
                                    np.empty((1, 64), np.float32))
    with pytest.raises(ValueError, match="llm_matmul_argmax: best must hold M indices"):
        _native.llm_matmul_argmax(w4, x, np.empty((1, 64), np.float32), None, np.empty(2, np.int64))
    with pytest.raises(ValueError, match="llm_matmul_argmax: best must be a writable"):
        _native.llm_matmul_argmax(w4, x, np.empty((1, 64), np.float32), None, np.empty(1, np.int32))


def test_verify_rows_from_matmul_argmax_accept_as_numpy_argmax():
    """A greedy verify step takes each of its rows' tokens from the LM head's argmax (Llm.greedy_hint over the
    second output of llm_matmul_argmax): the accepted count and the next token equal those of numpy's argmax of
    the same rows, with ties of the maximum (repeated weight rows), a row whose logits hold one NaN (a NaN input:
    the whole row), a NaN logit (bias) in every row, and drafts right to every length."""
    from types import SimpleNamespace

    from hetero.contract import HeteroError
    from hetero.llm.model import Llm
    from hetero.llm.sampler import Sampler, no_hint
    from hetero.llm.speculative.accept import accept
    from hetero.llm.speculative.drafter import Draft

    n, m, k = 4099, 5, K
    r = np.random.default_rng(3)
    base = r.standard_normal((64, k)).astype(np.float32)
    w = _native.llm_weights(base[r.integers(0, 64, n)].astype(np.float16), "f16", k=k)
    nan_bias = np.zeros(n, np.float32)
    nan_bias[3001] = np.nan
    for name, bias, nan_row in (("ties", None, None), ("nan row", None, 3), ("nan logit", nan_bias, None)):
        x = _x(m, seed=5)
        if nan_row is not None:
            x[nan_row, 7] = np.nan
        logits, best = np.empty((m, n), np.float32), np.empty(m, np.int64)
        _native.llm_matmul_argmax(w, x, logits, bias, best)
        want = _np_argmax_rows(logits)
        np.testing.assert_array_equal(best, want, err_msg=name)
        llm = SimpleNamespace(_best=(logits, best.tolist()))
        rows = logits[1:]  # a verify's trailing rows, as Llm._verify returns them

        def hint(row, llm=llm):
            return Llm.greedy_hint(llm, row)  # type: ignore[arg-type]  # why: the method reads _best only

        assert [hint(row) for row in rows] == want[1:].tolist()
        assert hint(logits[0, :9]) is None and hint(logits[:, 0]) is None  # not a whole row
        assert hint(logits.copy()[1]) is None  # another array's row
        for right in range(m):  # drafts whose first `right` tokens are numpy's argmax
            tokens = [int(t) if i < right else (int(t) + 1) % n for i, t in enumerate(want[1:m])]
            draft = Draft(tokens[:m - 2])
            results = []
            for h in (hint, no_hint):
                try:
                    results.append(accept(Sampler(), rows, draft, [1, 2], h))
                except HeteroError as e:  # a whole NaN row: "no finite logit", with or without the hint
                    results.append(("error", str(e)))
            assert results[0] == results[1], (name, right)
            if nan_row is None:
                n_ok = min(right, m - 2)
                assert results[0] == (n_ok, int(want[1 + n_ok])), (name, right)



# -- the fuser ------------------------------------------------------------------------------------------------------
def _program(spec: str = "q4", h: int = 256, inter: int = 512, m: int = 1):
    """A decoder layer's bound calls on m rows: q / k / v of one input, o + residual, gate / up / SwiGLU, down +
    residual."""
    ws = {name: _weights(spec, n, k, seed=i) for i, (name, n, k) in enumerate(
        [("q", h, h), ("k", 128, h), ("v", 128, h), ("o", h, h), ("gate", inter, h), ("up", inter, h),
         ("down", h, inter)])}
    buf = {name: np.zeros((m, n), np.float32) for name, n in
           [("x", h), ("q", h), ("k", 128), ("v", 128), ("o", h), ("h1", h), ("g", inter), ("u", inter),
            ("act", inter), ("d", h), ("h2", h)]}
    buf["x"][:] = _x(m, h, seed=9)
    resid = _x(m, h, seed=10)
    mm = functools.partial
    program = [
        mm(_native.llm_matmul, ws["q"], buf["x"], buf["q"], None),
        mm(_native.llm_matmul, ws["k"], buf["x"][:], buf["k"], np.ones(128, np.float32)),  # another view of x
        mm(_native.llm_matmul, ws["v"], buf["x"], buf["v"], None),
        mm(_native.llm_matmul, ws["o"], buf["q"], buf["o"], None),
        mm(_native.binary, "add", resid, buf["o"], buf["h1"]),
        mm(_native.llm_matmul, ws["gate"], buf["h1"], buf["g"], None),
        mm(_native.llm_matmul, ws["up"], buf["h1"], buf["u"], None),
        mm(_native.llm_swiglu, buf["g"], buf["u"], buf["act"]),
        mm(_native.llm_matmul, ws["down"], buf["act"], buf["d"], None),
        mm(_native.binary, "add", buf["d"], buf["h1"], buf["h1"]),  # in place, the matmul's output first
    ]
    return program, buf


def _run(program, buf):
    for name, b in buf.items():
        if name != "x":
            b[:] = np.nan
    for call in program:
        call()
    return {name: b.copy() for name, b in buf.items()}


@pytest.mark.parametrize("spec", ["q4", "q4_k"])
@pytest.mark.parametrize("m", [1, 4, 9, 16, 17])
def test_fuser_merges_a_decoder_layer_and_keeps_its_results(threads, spec, m):
    program, buf = _program(spec, m=m)
    fused = fuse.fuse_calls(program)
    names = [c.func.__name__ for c in fused]
    if m <= fuse.ROWS:  # decode, a batched step of a few sequences, a verify step
        assert names == ["llm_matmul_multi", "llm_matmul_residual", "llm_matmul_swiglu", "llm_matmul_residual"]
    else:  # prefill keeps its calls
        assert names == [c.func.__name__ for c in program]
    want = _run(program, buf)
    got = _run(fused, buf)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_fuser_leaves_calls_it_cannot_merge():
    program, buf = _program()
    # SwiGLU of other buffers than the two matmuls wrote (gate and up still share a region), an add of something
    # else than o_proj's output, a v_proj writing over the input q / k read (no q / k / v merge then)
    other = np.zeros_like(buf["g"])
    program[7] = functools.partial(_native.llm_swiglu, other, buf["u"], buf["act"])
    program[4] = functools.partial(_native.binary, "add", buf["x"], buf["q"], buf["h1"])
    program[2] = functools.partial(_native.llm_matmul, program[2].args[0], buf["x"], buf["x"], None)
    fused = fuse.fuse_calls(program)
    names = [c.func.__name__ for c in fused]
    assert names == ["llm_matmul", "llm_matmul", "llm_matmul", "llm_matmul", "binary", "llm_matmul_multi",
                     "llm_swiglu", "llm_matmul_residual"]
    assert fuse.fuse_calls([]) == []


def test_fused_decode_equals_unfused_decode(monkeypatch):
    """The tiny synthetic Qwen3 (q4 and a Qwen2-like set with q/k/v biases): logits of replayed decode steps with the
    fuser on equal those with it off."""
    from hetero.llm.synthetic import load_synthetic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load_synthetic("tiny", "q4", backends=["cpu"], on_fallback="silent", threads=2, context=32,
                             progress=False)
    seen = []
    original = fuse.fuse_calls

    def counting(program):
        out = original(program)
        seen.append(sum(getattr(c, "func", None) is _native.llm_matmul_swiglu for c in out))
        return out

    monkeypatch.setattr(fuse, "fuse_calls", counting)

    def decode() -> list[np.ndarray]:
        llm.reset()
        llm.prefill([1, 2, 3, 4])
        return [np.array(llm.forward([t])) for t in (5, 6, 7, 8, 9)]  # the replay is recorded by the 2nd/3rd

    on = decode()
    assert seen and max(seen) == llm.config.num_layers  # every layer's gate / up / SwiGLU fused
    llm.session.invalidate_replay()
    monkeypatch.setenv("HETERO_CPU_FUSE", "0")
    off = decode()
    for a, b in zip(on, off, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("m", [1, 2, 9, 17])
def test_fused_outputs_may_reuse_the_input_memory(threads, m):
    # The arena puts SwiGLU's output (or the residual sum) where x was once up_proj (o_proj) has read it: the
    # fused kernels read x before writing anything, so the result is still the unfused one.
    h, inter = 256, 512
    wg, wu, wo = _weights("q4_k", inter, h, seed=6), _weights("q4_k", inter, h, seed=7), _weights("q4", h, h, seed=8)
    x0 = _x(m, h, seed=11)
    arena = np.zeros(m * inter, np.float32)
    x = arena[:m * h].reshape(m, h)
    act = arena.reshape(m, inter)
    g, u, o = np.zeros((m, inter), np.float32), np.zeros((m, inter), np.float32), np.zeros((m, h), np.float32)
    resid = _x(m, h, seed=12)
    mm = functools.partial
    program = [mm(_native.llm_matmul, wg, x, g, None), mm(_native.llm_matmul, wu, x, u, None),
               mm(_native.llm_swiglu, g, u, act)]
    residual = [mm(_native.llm_matmul, wo, x, o, None), mm(_native.binary, "add", o, resid, x)]
    for calls, name in ((program, "llm_matmul_swiglu"), (residual, "llm_matmul_residual")):
        fused = fuse.fuse_calls(calls)
        # a few rows (decode, a batched step, a verify step) are fused; more (prefill) keep their calls
        assert [c.func.__name__ for c in fused] == ([name] if m <= fuse.ROWS else [c.func.__name__ for c in calls])
        results = []
        for run in (calls, fused):
            x[:] = x0
            for call in run:
                call()
            results.append((arena.copy(), g.copy(), u.copy(), o.copy()))
        for a, b in zip(*results, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("settings", [dict(HETERO_LLM_TASKS="0"), dict(HETERO_LLM_TASKS="1"),
                                      dict(HETERO_LLM_BLOCKS="0"), dict(HETERO_LLM_BLOCKS="1"),
                                      dict(HETERO_LLM_BLOCKS="1", HETERO_LLM_PFNEXT="65536"),
                                      dict(HETERO_LLM_BLOCKS="3"),
                                      dict(HETERO_LLM_KVTOUCH="0"), dict(HETERO_LLM_ORDER="0"),
                                      dict(HETERO_LLM_PF="0", HETERO_LLM_PF_ROWS="65536")])
def test_fused_calls_under_other_work_splits(settings):
    """The split settings (read once per process) change only which thread computes which 16-row groups: shrinking
    chunks (TASKS=0; the fused q / k / v split as one sequence over the parts, chunks cut at part borders), one task
    per thread (1), the split by bytes (BLOCKS=1: one block per thread, q / k / v laid end to end, a late thread's
    share taken by halves; by default the fused q / k / v calls' split, BLOCKS=0: equal tasks for them too,
    BLOCKS=3: q / k / v and the one-matrix GEMVs of >= 16 MiB, test_llm_threads.py's big GEMV included) and
    that with the next call's weights prefetched (PFNEXT, inside merged steps) give the same bits as the unfused
    calls; a decode step's attention without its KV read-ahead (KVTOUCH=0: one task per kv
    head, no loads or prefetches ahead) the reference's; equal tasks taken in index order (ORDER=0; by default
    each thread's claims walk a run of consecutive tasks, claim_order); the tiles' prefetch distances (PF for one
    row, PF_ROWS for 2+: here none, and 64 KiB past the end of small weights) the same bits. The fused-call,
    merged-step, thread-split and attention tests, in a fresh process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, **settings)
    tests = "matmul_multi_equals or matmul_swiglu_equals or matmul_residual_equals or fused_outputs_may_reuse"
    tests += " or matmul_argmax"
    tests += " or decoder_layer or whole_decode_step or late_workers or does_not_depend_on_the_thread_count"
    tests += " or attention_prefill_decode_rollback or big_gemv_split_by_bytes"
    files = ("test_step.py", "test_llm_threads.py", "test_llm_kernels.py")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                        *(str(Path(__file__).with_name(f)) for f in files),
                        "-k", tests],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
