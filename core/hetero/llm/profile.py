"""Where an LLM decode step's time goes: inside the backends' native code, or outside it (Python), per op type.

Used by ``hetero bench --profile`` and ``benchmarks/decode_profile.py``.

Method: the same decode step (one token after ``prompt`` cached tokens, the cache rolled back to that point before
each pass so that every pass sees the same context lengths) is timed three ways, after warm-up steps (so the session
replays its recorded steady-state run):

1. plain: ``Llm.forward([token])`` with nothing instrumented -> the step time T (median over the steps);
2. kernels: every kernel's ``run`` wrapped with a timer (an instance attribute, so the session's replay records the
   wrapper), and every call its ``bind`` makes for the replay (``CpuKernel.bind``) -> time inside the kernels' calls
   per op type (K);
3. native: additionally, every call from a kernel into a compiled extension module (the backend's ``_native``: its
   module-level functions and the native objects a kernel holds, e.g. the attention's KV-cache object) wrapped with
   a timer -> time inside native code per op type (N).

Each quantity comes from the pass that does not inflate it. ``outside native = T - N`` = ``runtime (T - K)``
(``Llm.forward``, the session / replay loop, feeds and outputs) + ``kernel wrappers (K - N)`` (the Python in each
``kernel.run`` or bound call). numpy calls count as outside. Medians per step, so an interrupted step does not skew
them, and each way's figures from its quietest round (see ``profile_decode``).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..contract.errors import HeteroError


@dataclass
class OpProfile:
    op: str
    calls: int  # per step
    kernel_us: float  # inside kernel.run, per step
    native_us: float  # inside native calls, per step
    native_calls: int  # per step

    @property
    def wrapper_us(self) -> float:
        return max(0.0, self.kernel_us - self.native_us)


@dataclass
class DecodeProfile:
    model: str
    threads: int | None
    context: int  # cached tokens before the first profiled step
    steps: int
    step_us: float  # plain step time (median)
    kernel_us: float  # sum over ops of the time inside kernel.run (median step)
    native_us: float  # time inside native calls (median step)
    ops: list[OpProfile] = field(default_factory=list)
    native_modules: list[str] = field(default_factory=list)
    cprofile: str = ""
    clock: str = "wall"  # or "cpu": this thread's CPU time (see profile_decode)

    @property
    def outside_us(self) -> float:
        return max(0.0, self.step_us - self.native_us)

    @property
    def outside_pct(self) -> float:
        return 100.0 * self.outside_us / self.step_us if self.step_us else 0.0

    @property
    def runtime_us(self) -> float:
        return max(0.0, self.step_us - self.kernel_us)

    @property
    def wrapper_us(self) -> float:
        return max(0.0, self.kernel_us - self.native_us)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(outside_us=self.outside_us, outside_pct=self.outside_pct, runtime_us=self.runtime_us,
                 wrapper_us=self.wrapper_us,
                 tokens_per_second=1e6 / self.step_us if self.step_us else 0.0)
        for op, src in zip(d["ops"], self.ops, strict=True):
            op["wrapper_us"] = src.wrapper_us
        return d

    def markdown(self) -> str:
        s = self.step_us
        lines = [
            f"decode step of {self.model} (threads={self.threads}, context {self.context}, "
            f"{self.steps} steps, medians{', CPU time of the calling thread' if self.clock == 'cpu' else ''}): "
            f"{s / 1e3:.2f} ms = {1e6 / s:.1f} tokens/s",
            f"outside native code: {self.outside_us / 1e3:.3f} ms = {self.outside_pct:.1f}% of the step "
            f"(runtime: session / replay / Llm.forward {self.runtime_us / 1e3:.3f} ms = "
            f"{100 * self.runtime_us / s:.1f}%; Python in kernel.run {self.wrapper_us / 1e3:.3f} ms = "
            f"{100 * self.wrapper_us / s:.1f}%)",
            f"native code ({', '.join(self.native_modules) or 'none found'}): {self.native_us / 1e3:.3f} ms = "
            f"{100 * self.native_us / s:.1f}%",
            "",
            "| op | calls | native calls | in kernel.run µs | in native µs | Python in kernel.run µs | "
            "% of step outside native | % of step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for op in sorted(self.ops, key=lambda o: -o.kernel_us):
            lines.append(f"| {op.op} | {op.calls} | {op.native_calls} | {op.kernel_us:.1f} | {op.native_us:.1f} | "
                         f"{op.wrapper_us:.1f} | {100 * op.wrapper_us / s:.2f} | {100 * op.kernel_us / s:.1f} |")
        lines.append(f"| (runtime, between kernels) | | | | | {self.runtime_us:.1f} | "
                     f"{100 * self.runtime_us / s:.2f} | {100 * self.runtime_us / s:.1f} |")
        if self.cprofile:
            lines += ["", "cProfile, top functions by own time (inflated by the profiler):", "```", self.cprofile,
                      "```"]
        return "\n".join(lines)


# -- instrumentation ------------------------------------------------------------------------------------------------
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def _tick(now: Callable[[], float], n: int = 2000) -> float:
    """What an empty timed window reads (the clock's own cost), subtracted from every window."""
    return statistics.median(-now() + now() for _ in range(n))


class _Clock:
    """Accumulates time per op for the current step; ``now`` is the clock (wall, or this thread's CPU time)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.tick = _tick(now)
        self.current = ""
        self.kernel: dict[str, float] = defaultdict(float)
        self.native: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.native_calls: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.kernel.clear()
        self.native.clear()
        self.calls.clear()
        self.native_calls.clear()


class _NativeObject:
    """A native object held by a kernel (e.g. a KV cache): calls are timed, attributes pass through."""

    def __init__(self, obj: Any, clock: _Clock) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_clock", clock)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        clock = self._clock
        args = tuple(a._obj if isinstance(a, _NativeObject) else a for a in args)
        t0 = clock.now()
        try:
            return self._obj(*args, **kwargs)
        finally:
            clock.native[clock.current] += clock.now() - t0 - clock.tick
            clock.native_calls[clock.current] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._obj, name, value)


def _timed_native(fn: Callable, clock: _Clock) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a._obj if isinstance(a, _NativeObject) else a for a in args)
        t0 = clock.now()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.native[clock.current] += clock.now() - t0 - clock.tick
            clock.native_calls[clock.current] += 1

    return call


class _NativeModule:
    """Stands in for an extension module in a kernel module's globals: its functions are timed."""

    def __init__(self, module: types.ModuleType, clock: _Clock) -> None:
        self._module, self._clock = module, clock
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        cache = self.__dict__["_cache"]
        if name in cache:
            return cache[name]
        value = getattr(self._module, name)
        if isinstance(value, types.BuiltinFunctionType):
            value = _timed_native(value, self._clock)
        cache[name] = value
        return value


def _is_extension(module: Any) -> bool:
    return isinstance(module, types.ModuleType) and str(getattr(module, "__file__", "") or "").endswith((".so",
                                                                                                         ".pyd"))


def _package(name: str) -> str:
    return name.split(".", 1)[0]


def _op_name(node: Any) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain and node.domain not in ("", "hetero") else node.op_type


def _wrap_objects(kernel: Any, clock: _Clock, found: set[str]) -> None:
    """Time the callable native objects a kernel holds (``prepare`` may replace them: checked at every call)."""
    package = _package(type(kernel).__module__)
    for name, value in list(vars(kernel).items()):
        owner = type(value).__module__
        if (callable(value) and not isinstance(value, (type, _NativeObject)) and _package(owner) == package
                and _is_extension(sys.modules.get(owner))):
            setattr(kernel, name, _NativeObject(value, clock))
            found.add(owner)


def _unwrap_objects(kernel: Any) -> None:
    for name, value in list(vars(kernel).items()):
        if isinstance(value, _NativeObject):
            setattr(kernel, name, value._obj)


def _timed(fn: Callable, op: str, clock: _Clock, before: Callable[[], None] | None = None) -> Callable:
    """``fn`` (a kernel's run, or a bound call) timed as one call of ``op``."""

    def timed(*args: Any, **kw: Any) -> Any:
        if before is not None:
            before()
        previous, clock.current = clock.current, op
        t0 = clock.now()
        try:
            return fn(*args, **kw)
        finally:
            clock.kernel[op] += clock.now() - t0 - clock.tick
            clock.calls[op] += 1
            clock.current = previous

    return timed


def _timed_bind(bind: Callable, op: str, clock: _Clock, wrap: Callable[[], None] | None) -> Callable:
    """A kernel's ``bind`` whose bound calls are timed; native objects are wrapped first, so the call holds the
    timed ones (the module's ``_native`` is already the timed stand-in when the replay is recorded)."""

    def timed_bind(inputs: Any, outputs: Any) -> Callable | list[Callable] | None:
        if wrap is not None:
            wrap()
        call = bind(inputs, outputs)
        if call is None or callable(call):
            return None if call is None else _timed(call, op, clock)
        return [_timed(c, op, clock) for c in call]  # one bound call per device launch

    return timed_bind


def _restorer(obj: Any, name: str) -> Callable[[], None]:
    """Undoes setting ``obj.name``: puts back an instance attribute it replaces, or removes the one it adds."""
    if name in vars(obj):
        return functools.partial(setattr, obj, name, vars(obj)[name])
    return functools.partial(vars(obj).pop, name, None)


@contextlib.contextmanager
def _instrument(session: Any, clock: _Clock, native: bool) -> Iterator[set[str]]:
    """Wrap every kernel's run (and, with ``native``, its calls into its own package's extension modules); undone
    on exit."""
    undo: list[Callable[[], None]] = []
    found: set[str] = set()
    try:
        for node, kernel in session.kernels():
            op = _op_name(node)
            run = kernel.run
            # The object whose method ``run`` is: the kernel itself, or the one a wrapper forwards to (the opencl
            # plugin's dtype guard sets ``run`` to its inner kernel's bound method).
            owner = getattr(run, "__self__", kernel)
            if native:
                module = sys.modules.get(type(owner).__module__)
                package = _package(type(owner).__module__)
                for name, value in list(vars(module).items()) if module else []:
                    if _is_extension(value) and _package(value.__name__) == package:
                        setattr(module, name, _NativeModule(value, clock))
                        undo.append(functools.partial(setattr, module, name, value))
                        found.add(value.__name__)
                undo.append(functools.partial(_unwrap_objects, owner))
            wrap = functools.partial(_wrap_objects, owner, clock, found) if native else None
            undo.append(_restorer(kernel, "run"))
            kernel.run = _timed(run, op, clock, wrap)
            bind = getattr(kernel, "bind", None)
            if bind is not None:  # the replay calls what bind returns instead of run: time that
                undo.append(_restorer(kernel, "bind"))
                kernel.bind = _timed_bind(bind, op, clock, wrap)
        session.invalidate_replay()  # re-record the steady-state run with the wrappers
        yield found
    finally:
        for action in reversed(undo):
            action()
        session.invalidate_replay()  # and without them


def _step(llm: Any, ids: list[int], i: int, width: int) -> None:
    """Step i of a pass: one token after the last (a decode step), or (width > 1) a verify step of ``width``
    tokens after what the cache holds (the caller rolls it back to the prompt first, outside any timing)."""
    if width == 1:
        llm.forward([ids[i]])
        return
    llm.verify([ids[(i + j) % len(ids)] for j in range(width)])


def _steps(llm: Any, ids: list[int], prompt: list[int], warmup: int, clock: _Clock | None,
           now: Callable[[], float] = time.perf_counter, width: int = 1
           ) -> tuple[list[float], list[dict[str, float]], list[dict[str, float]], list[dict[str, int]],
                      list[dict[str, int]]]:
    llm.reset()
    llm.prefill(prompt)
    for i in range(warmup):
        if width > 1:
            llm.rollback(len(prompt))
        _step(llm, ids, i, width)
    llm.rollback(len(prompt))  # every pass profiles the same positions, with the replay already recorded
    times, kernel, native, calls, ncalls = [], [], [], [], []
    for i in range(warmup, len(ids)):
        if clock is not None:
            clock.reset()
        if width > 1:
            llm.rollback(len(prompt))  # outside the timed step
        t0 = now()
        _step(llm, ids, i, width)
        times.append(now() - t0)
        if clock is not None:
            kernel.append(dict(clock.kernel))
            native.append(dict(clock.native))
            calls.append(dict(clock.calls))
            ncalls.append(dict(clock.native_calls))
    return times, kernel, native, calls, ncalls


def _total(per_step: list[dict[str, float]]) -> float:
    """The median over steps of the time summed over ops (seconds)."""
    return statistics.median(sum(step.values()) for step in per_step)


def _quietest(per_round: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """The round with the lowest median step total."""
    return min(per_round, key=_total)


def _median_step(per_step: list[dict[str, float]]) -> dict[str, float]:
    """Per op: the median over steps (seconds)."""
    ops = {op for step in per_step for op in step}
    return {op: statistics.median(step.get(op, 0.0) for step in per_step) for op in ops}


def profile_decode(llm: Any, steps: int = 64, prompt: int = 16, warmup: int = 4, seed: int = 0,
                   cprofile_top: int = 0, rounds: int = 8, clock: str = "wall", width: int = 1) -> DecodeProfile:
    """Profile ``steps`` single-token decode steps of ``llm`` (an ``hetero.llm.Llm``) per way of timing, in
    ``rounds`` interleaved rounds (plain, kernels, native, plain, ...) so that a busy neighbour hits all three alike.
    Each way's figures come from its quietest round (the lowest median step): a neighbour only ever adds time, so
    the minimum over rounds is the estimate least inflated by one, and every way gets the same chance at a quiet
    round. ``clock="cpu"`` times everything in this thread's CPU time instead of wall time: time a neighbour takes
    the core away no longer counts, so the split holds on a busy machine (with 1 thread the step is all this
    thread's work; with more, the step is this thread's share plus its spinning at the pool's barriers, which is
    close to the wall time on a quiet machine). The context must hold ``prompt + warmup + steps / rounds`` tokens.
    ``width`` > 1: each step is instead a speculative verify of ``width`` tokens (``Llm.verify``) after the
    ``prompt`` tokens, the cache rolled back to them before each (untimed). The cache is reset afterwards."""
    rounds = max(1, min(rounds, steps))
    per = max(1, steps // rounds)
    need = prompt + warmup + per
    if need > llm.context:
        raise HeteroError(f"profile_decode needs a context of {need} tokens; the model has {llm.context}")
    rng = np.random.default_rng(seed)
    vocab = llm.config.vocab_size
    prompt_ids = rng.integers(0, vocab, size=prompt).tolist()
    ids = rng.integers(0, vocab, size=warmup + per).tolist()
    session = llm.session
    if clock not in CLOCKS:
        raise HeteroError(f"profile_decode: clock={clock!r}; expected one of {sorted(CLOCKS)}")
    now = CLOCKS[clock]
    timer = _Clock(now)
    plain: list[list[float]] = []  # per round: step times
    kernel: list[list[dict[str, float]]] = []  # per round, per step: op -> seconds
    native: list[list[dict[str, float]]] = []
    calls: list[dict[str, int]] = []
    ncalls: list[dict[str, int]] = []
    modules: set[str] = set()
    for _ in range(rounds):
        plain.append(_steps(llm, ids, prompt_ids, warmup, None, now, width)[0])
        with _instrument(session, timer, native=False):
            _, k, _, c, _ = _steps(llm, ids, prompt_ids, warmup, timer, now, width)
        kernel.append(k)
        calls += c
        with _instrument(session, timer, native=True) as found:
            _, _, n, _, nc = _steps(llm, ids, prompt_ids, warmup, timer, now, width)
        native.append(n)
        ncalls += nc
        modules |= found
    text = ""
    if cprofile_top:
        import cProfile
        import io
        import pstats

        llm.reset()
        llm.prefill(prompt_ids)
        for token in ids[:warmup]:
            llm.forward([token])
        llm.rollback(len(prompt_ids))
        profiler = cProfile.Profile()
        profiler.enable()
        for token in ids[warmup:]:
            llm.forward([token])
        profiler.disable()
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(cprofile_top)
        text = "\n".join(line for line in buf.getvalue().splitlines() if line.strip())
    llm.reset()

    step_s = min(statistics.median(r) for r in plain)
    k_round, n_round = _quietest(kernel), _quietest(native)
    k_ops, n_ops = _median_step(k_round), _median_step(n_round)
    ops = []
    for op in sorted(set(k_ops) | set(n_ops)):
        ops.append(OpProfile(op, calls=int(statistics.median(c.get(op, 0) for c in calls)),
                             kernel_us=1e6 * k_ops.get(op, 0.0), native_us=1e6 * n_ops.get(op, 0.0),
                             native_calls=int(statistics.median(c.get(op, 0) for c in ncalls))))
    return DecodeProfile(
        model=f"{llm.name}" + (f" {llm.quant}" if llm.quant else ""), threads=llm.threads, context=prompt,
        steps=sum(len(r) for r in plain), step_us=1e6 * step_s,
        kernel_us=1e6 * _total(k_round), native_us=1e6 * _total(n_round),
        ops=ops, native_modules=sorted(modules), cprofile=text, clock=clock)


# -- command line ------------------------------------------------------------------------------------------------


def context_needed(steps: int = 64, prompt: int = 16, warmup: int = 4, rounds: int = 8) -> int:
    """The KV-cache length ``profile_decode`` needs with these arguments."""
    return prompt + warmup + max(1, steps // max(1, min(rounds, steps)))
