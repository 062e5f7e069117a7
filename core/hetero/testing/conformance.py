"""The conformance kit: contract checks and per-op numeric checks that any backend, ours or a third party's, runs.

    from hetero.testing import conformance
    conformance.run(backend="mybackend")          # in a test: prints PASS/FAIL per check, raises on any FAIL
    report = conformance.check_backend("mybackend", ops=["Relu", "MatMul"])

or from a shell: ``python -m hetero.testing --backend mybackend``.

Contract checks call the backend directly: the factory, ``create``, ``supports`` (a ``Support``, with a reason when
it refuses), memory round trips, and every claimed kernel through the calls a session makes — ``prepare`` (again
when shapes change), then ``run`` on outputs the kit allocated, which the kernel must write in place: rebinding an
output's buffer, replacing an output tensor, leaving an output unwritten or writing into an input all fail, as
does a ``bind()`` whose callable (or list of callables, called in order) does not do what ``run`` does.

Op checks build a single-node ONNX model per case of ``cases.CASES`` whose op the backend claims (its ``supports``
answer on the case's ``NodeInfo``), run it through ``Session(..., backends=[name], on_fallback="error")`` and compare
with the numpy reference backend within the output dtype's tolerance. Ops the backend refuses are SKIPs, not FAILs:
a backend implements what its hardware does well.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import plugins
from ..contract import dtypes, registry
from ..contract.backend import API_VERSION, Backend, Device, Kernel, NodeInfo, Support
from ..contract.graph import Node
from ..contract.tensor import Tensor, TensorInfo
from . import cases as case_table
from .cases import Case

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
REFERENCE = "reference"

# (rtol, atol) by output dtype; integer and boolean outputs must match exactly.
TOLERANCE: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
    "float32": (1e-4, 1e-5),
    "float64": (1e-10, 1e-12),
}


@dataclass(frozen=True)
class Result:
    backend: str
    check: str
    status: str  # PASS | FAIL | SKIP
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.status}  {self.backend}  {self.check}" + (f": {self.reason}" if self.reason else "")


@dataclass
class Report:
    backend: str
    results: list[Result] = field(default_factory=list)

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failures

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def summary(self) -> str:
        return f"{self.backend}: {self.count(PASS)} passed, {self.count(FAIL)} failed, {self.count(SKIP)} skipped"

    def __str__(self) -> str:
        return "\n".join([*map(str, self.results), self.summary()])


class CheckFailed(Exception):
    """Raised inside a check: the backend broke the contract or gave wrong numbers."""


class CheckSkipped(Exception):
    """Raised inside a check: it does not apply (op not claimed, schema unknown, backend cannot start)."""


class Context:
    """What the checks of one backend share: its status row, one backend instance created on first use, and the
    reference results of the cases (computed once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._backend: Backend | None = None
        self.expected: dict[str, list[np.ndarray]] = {}

    def row(self) -> plugins.PluginStatus:
        row = plugins.status(self.name)
        if row is None:
            installed = ", ".join(r.name for r in plugins.statuses())
            raise CheckFailed(f"backend {self.name!r} is not installed (installed: {installed})")
        return row

    def require_ok(self) -> plugins.PluginStatus:
        row = plugins.status(self.name)
        if row is None or not row.ok or row.factory is None:
            raise CheckSkipped(f"backend {self.name!r} cannot start (see the status check)")
        return row

    def backend(self) -> Backend:
        if self._backend is None:
            row = self.require_ok()
            assert row.factory is not None
            self._backend = row.factory.create(row.devices[0], {})
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[Context], str | None]  # returns an optional note for a PASS; raises CheckFailed / CheckSkipped

    def run(self, ctx: Context) -> Result:
        try:
            note = self.fn(ctx)
        except CheckSkipped as exc:
            return Result(ctx.name, self.name, SKIP, str(exc))
        except CheckFailed as exc:
            return Result(ctx.name, self.name, FAIL, str(exc))
        except Exception as exc:  # the backend's own exception is the finding
            return Result(ctx.name, self.name, FAIL, _shorten(f"raised {type(exc).__name__}: {exc}"))
        return Result(ctx.name, self.name, PASS, note or "")


def _shorten(text: str, limit: int = 400) -> str:
    # Exceptions from native code may embed whole arrays; one result line should stay readable.
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 5] + " ..."


# -- contract checks ---------------------------------------------------------------------------------------------
def _check_status(ctx: Context) -> str:
    row = ctx.row()
    if not row.ok:
        hint = f" (hint: {row.hint})" if row.hint else ""
        raise CheckFailed(f"status {row.status}: {row.reason}{hint}")
    return f"{row.distribution} {row.version}, devices: {', '.join(map(str, row.devices))}"


def _check_factory(ctx: Context) -> None:
    factory = ctx.require_ok().factory
    if factory is None:
        raise CheckFailed("the backend's status row has no factory")
    if getattr(factory, "name", None) != ctx.name:
        raise CheckFailed(f"factory.name is {getattr(factory, 'name', None)!r}, expected {ctx.name!r}")
    version = getattr(factory, "api_version", None)  # None: the version its plugin module states
    if version is not None and (not isinstance(version, str) or version.split(".")[0] != API_VERSION.split(".")[0]):
        raise CheckFailed(f"factory.api_version is {version!r}; hetero's plugin API is {API_VERSION}")
    if not isinstance(getattr(factory, "priority", 50), int):
        raise CheckFailed("factory.priority must be an int")
    devices = factory.probe()
    if not isinstance(devices, list) or not devices or not all(isinstance(d, Device) for d in devices):
        raise CheckFailed(f"probe() must return a non-empty list of hetero.contract.Device, got {devices!r}")


def _check_create(ctx: Context) -> str:
    backend = ctx.backend()
    if not isinstance(backend, Backend):
        raise CheckFailed(f"create() returned {type(backend).__name__}, not a hetero.contract.Backend")
    if backend.name != ctx.name:
        raise CheckFailed(f"the backend's name is {backend.name!r}, its factory's {ctx.name!r}")
    if not isinstance(backend.memory_domain, str) or not backend.memory_domain:
        raise CheckFailed("memory_domain must be a non-empty string")
    if "memory_domain" in vars(backend):
        raise CheckFailed(f"memory_domain is set on the instance ({backend.memory_domain!r}); it is a class attribute, "
                          "the same for every device of the backend")
    return f"{backend!r}, memory domain {backend.memory_domain}"


def _unknown_op_info() -> NodeInfo:
    info = TensorInfo(dtypes.float32, (2, 3))
    node = Node("NoSuchOp", ["a"], ["b"], {}, "probe", "hetero.conformance")
    return NodeInfo(node, [info], [info], {}, 1)


def _check_supports(ctx: Context, selected: Sequence[Case]) -> str:
    backend = ctx.backend()
    infos = [_case_info(case)[1] for case in selected if _schema_known(case)]
    verdicts = []
    for info in [*infos, _unknown_op_info()]:
        verdict = backend.supports(info)
        if not isinstance(verdict, Support):
            raise CheckFailed(f"supports({info.op_type}) returned {type(verdict).__name__}, not a Support")
        if not verdict.ok and not verdict.reason:
            raise CheckFailed(f"supports({info.op_type}) refused without a reason")
        if verdict.ok and not backend.takes_op_type(info.domain, info.op_type):
            # the session would then leave out the fusions to this op although the backend runs it
            raise CheckFailed(f"supports() accepts a {info.op_type} node but takes_op_type({info.domain!r}, "
                              f"{info.op_type!r}) says no such op runs here")
        verdicts.append(verdict.ok)
    if verdicts.pop():
        raise CheckFailed("supports() claims an op no schema defines (hetero.conformance::NoSuchOp)")
    return f"claims {sum(verdicts)} of {len(infos)} cases"


_ROUND_TRIP = [
    np.arange(15, dtype=np.float32).reshape(3, 5) - 7.5,
    np.linspace(-2, 2, 8, dtype=np.float16),
    np.array(3.25, dtype=np.float32),
    np.arange(-6, 6, dtype=np.int64).reshape(2, 2, 3),
    np.arange(7, dtype=np.int32),
    np.arange(256, dtype=np.uint8),
    np.array([True, False, True]),
]


def _check_memory(ctx: Context) -> None:
    backend = ctx.backend()
    for array in _ROUND_TRIP:
        what = f"{array.dtype}{list(array.shape)}"
        tensor = backend.upload(array)
        if tuple(tensor.shape) != array.shape or tensor.dtype != dtypes.from_numpy(array.dtype):
            raise CheckFailed(f"upload({what}) gave a tensor of {tensor.dtype}{list(tensor.shape)}")
        if tensor.backend is not backend:
            raise CheckFailed(f"upload({what}) gave a tensor owned by {tensor.backend!r}, not by the backend")
        back = np.asarray(backend.download(tensor))
        if back.dtype != array.dtype or back.shape != array.shape or not np.array_equal(back, array):
            raise CheckFailed(f"download(upload({what})) differs from the array uploaded")
        empty = backend.empty(TensorInfo(tensor.dtype, array.shape))
        if tuple(empty.shape) != array.shape or empty.dtype != tensor.dtype:
            raise CheckFailed(f"empty({what}) gave {empty.dtype}{list(empty.shape)}")
    if backend.alloc(64, "scratch") is None:
        raise CheckFailed("alloc(64) returned None")


@dataclass
class _Claimed:
    """One claimed case, ready for a kernel: its node, uploaded inputs, output infos and the reference results."""

    case: Case
    info: NodeInfo
    inputs: list[Tensor | None]
    out_infos: list[TensorInfo]
    expected: list[np.ndarray]


def _claimed(ctx: Context, selected: Sequence[Case]) -> list[_Claimed]:
    backend = ctx.backend()
    if type(backend).kernel is Backend.kernel:
        raise CheckSkipped("compile-style backend: it has no per-node kernels")
    claimed = []
    for case in selected:
        if not _schema_known(case):
            continue
        model, info = _case_info(case)
        if not backend.supports(info):
            continue
        if case.id not in ctx.expected:
            ctx.expected[case.id] = _reference_outputs(model, case)
        expected = ctx.expected[case.id]
        values = {**case_table.make_feeds(case), **_initializers(model)}
        inputs = [None if not n else backend.upload(values[n]) for n in info.node.inputs]
        out_infos = [TensorInfo(dtypes.from_numpy(e.dtype), e.shape) for e in expected]
        claimed.append(_Claimed(case, info, inputs, out_infos, expected))
    if not claimed:
        raise CheckSkipped("the backend claims none of the selected cases")
    return claimed


def _prepared(backend: Backend, item: _Claimed) -> tuple[Kernel, list[Tensor]]:
    """A kernel prepared for the case, and poisoned outputs allocated the way a session does."""
    kernel = backend.kernel(item.info)
    for method in ("prepare", "run"):
        if not callable(getattr(kernel, method, None)):
            raise CheckFailed(f"{item.case.id}: kernel() returned {type(kernel).__name__}, which has no {method}()")
    kernel.prepare([None if t is None else t.info for t in item.inputs], item.out_infos)
    return kernel, [backend.empty(i) for i in item.out_infos]


def _poison(outputs: list[Tensor]) -> None:
    # Host outputs start as garbage-looking values before each call, so that a kernel that does not write its output
    # (or computes into a buffer of its own) is caught.
    for out in outputs:
        if isinstance(out.buffer, np.ndarray) and out.buffer.dtype.kind == "f":
            out.buffer.fill(np.nan)
        elif isinstance(out.buffer, np.ndarray):
            out.buffer.fill(np.ones((), out.buffer.dtype) * 7)


def _expect_written(backend: Backend, item: _Claimed, outputs: list[Tensor], how: str) -> None:
    for index, (out, want) in enumerate(zip(outputs, item.expected, strict=True)):
        problem = compare(np.asarray(backend.download(out)), want)
        if problem:
            raise CheckFailed(f"{item.case.id} output {index} {how}: {problem}")


def _run_in_place(backend: Backend, item: _Claimed, outputs: list[Tensor], call: Callable[[list[Tensor]], Any],
                  how: str) -> None:
    """Call the kernel on a copy of ``outputs``; fail unless it wrote the kit's buffers and allocated nothing."""
    _poison(outputs)
    given = list(outputs)
    buffers = [t.buffer for t in outputs]
    call(given)
    for index, (out, passed, buffer) in enumerate(zip(outputs, given, buffers, strict=True)):
        if passed is not out:
            raise CheckFailed(f"{item.case.id}: {how} replaced outputs[{index}] with a new tensor; write into the "
                              "tensor given (run must not allocate)")
        if out.buffer is not buffer:
            raise CheckFailed(f"{item.case.id}: {how} rebound outputs[{index}].buffer instead of writing into it "
                              "(run must not allocate)")
    _expect_written(backend, item, outputs, how)


def _check_kernels(ctx: Context, selected: Sequence[Case]) -> str:
    backend = ctx.backend()
    claimed = _claimed(ctx, selected)
    for item in claimed:
        kernel, outputs = _prepared(backend, item)
        for attempt in ("run directly on preallocated outputs", "run again after a second prepare()"):
            _run_in_place(backend, item, outputs, functools.partial(kernel.run, item.inputs), attempt)
            # A session prepares again whenever shapes (or shape-deciding values) change: it must be repeatable.
            kernel.prepare([None if t is None else t.info for t in item.inputs], item.out_infos)
    return f"{len(claimed)} kernels"


def _check_inputs_untouched(ctx: Context, selected: Sequence[Case]) -> str:
    backend = ctx.backend()
    claimed = _claimed(ctx, selected)
    for item in claimed:
        kernel, outputs = _prepared(backend, item)
        before = [None if t is None else np.array(backend.download(t), copy=True) for t in item.inputs]
        kernel.run(item.inputs, outputs)
        for index, (tensor, value) in enumerate(zip(item.inputs, before, strict=True)):
            if tensor is not None and value is not None and compare(np.asarray(backend.download(tensor)), value):
                raise CheckFailed(f"{item.case.id}: run() wrote into input {index} (inputs are read-only: the session "
                                  "shares them with other readers)")
    return f"{len(claimed)} kernels"


def _without_arguments(call: Callable[[], Any]) -> Callable[[list[Tensor]], Any]:
    return lambda _outputs: call()  # a bound call works on the tensors it was bound to


def _in_order(calls: list[Callable[[], Any]]) -> Callable[[], None]:
    def call_all() -> None:
        for call in calls:
            call()

    return call_all


def _check_bind(ctx: Context, selected: Sequence[Case]) -> str:
    backend = ctx.backend()
    bound = 0
    for item in _claimed(ctx, selected):
        kernel, outputs = _prepared(backend, item)
        bind = getattr(kernel, "bind", None)
        if bind is None:
            continue
        bound_calls = bind(item.inputs, outputs)
        if bound_calls is None:
            continue
        calls = list(bound_calls) if isinstance(bound_calls, (list, tuple)) else [bound_calls]
        if not calls or not all(callable(c) for c in calls):
            raise CheckFailed(f"{item.case.id}: bind() returned {type(bound_calls).__name__}, not a callable, a "
                              "list of callables (one per device launch) or None")
        call = _in_order(calls)
        bound += 1
        for attempt in ("bound call", "bound call again"):  # the replay calls it step after step
            _run_in_place(backend, item, outputs, _without_arguments(call), attempt)
    if not bound:
        raise CheckSkipped("no claimed kernel binds (optional: the replay calls run() instead)")
    return f"{bound} bound kernels"


def _check_close(ctx: Context) -> None:
    row = ctx.require_ok()
    assert row.factory is not None
    backend = row.factory.create(row.devices[0], {})
    backend.close()
    backend.close()  # idempotent: sessions and users may both close it


# -- op checks ---------------------------------------------------------------------------------------------------
def _schema_known(case: Case) -> bool:
    return registry.find(case.domain, case.op) is not None


def _case_info(case: Case) -> tuple[Any, NodeInfo]:
    """The case's model and its node as a backend sees it, after the same shape inference a Session runs."""
    from ..frontends import load
    from ..runtime.infer import fold_and_infer

    model = case_table.build_model(case)
    graph = load(model)
    fold_and_infer(graph)
    node = graph.nodes[0]
    inputs = [graph.values.get(n) if n else None for n in node.inputs]
    outputs = [graph.values[n] for n in node.outputs]
    constants = {i: graph.initializers[n] for i, n in enumerate(node.inputs) if n in graph.initializers}
    return model, NodeInfo(node, inputs, outputs, constants, graph.opset(node.domain))


def _initializers(model: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _run_session(model: Any, backend: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from ..runtime.session import Session

    with Session(model, backends=[backend], on_fallback="error") as session:
        placed = {p.backend for p in session.placement.nodes}
        if placed != {backend}:
            raise CheckFailed(f"the session placed the node on {sorted(placed)}, not on {backend}")
        results = session.run(feeds)
        return [results[name] for name in session.output_names]


def _reference_outputs(model: Any, case: Case) -> list[np.ndarray]:
    return _run_session(model, REFERENCE, case_table.make_feeds(case))


def compare(got: np.ndarray, want: np.ndarray) -> str:
    """'' when ``got`` matches ``want`` (dtype, shape, values within the dtype's tolerance), else what differs."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    rtol, atol = TOLERANCE.get(str(want.dtype), (0.0, 0.0))
    floating = want.dtype.kind == "f"
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True) if floating else got != want
    if not bad.any():
        return ""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f" at {list(first)}" if first else ""
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    worst = np.max(np.where(np.isnan(diff), np.inf, diff)[bad])  # a NaN where a number belongs counts as inf
    return (
        f"{int(bad.sum())}/{bad.size} values differ, max abs error {worst:.3g}; first{where}: "
        f"got {got[first]!r}, expected {want[first]!r} (rtol {rtol}, atol {atol})"
    )


def _op_check(case: Case) -> Callable[[Context], str | None]:
    def check(ctx: Context) -> str | None:
        ctx.require_ok()
        if not _schema_known(case):
            raise CheckSkipped(f"this hetero has no schema for {case.op}")
        model, info = _case_info(case)
        verdict = ctx.backend().supports(info)
        if not verdict:
            raise CheckSkipped(f"not claimed: {verdict.reason}")
        expected = _reference_outputs(model, case)
        got = _run_session(model, ctx.name, case_table.make_feeds(case))
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = compare(g, e)
            if problem:
                raise CheckFailed(f"output {index}: {problem}")
        return None

    return check


# -- running -----------------------------------------------------------------------------------------------------
def plan(ops: Iterable[str] | None = None) -> list[Check]:
    """Every check, in order. Known without loading any plugin, so test frameworks can list them up front."""
    selected = case_table.cases(ops)
    return [
        Check("contract: status ok", _check_status),
        Check("contract: factory attributes and probe()", _check_factory),
        Check("contract: create() returns a Backend", _check_create),
        Check("contract: supports() answers with a Support and a reason", lambda ctx: _check_supports(ctx, selected)),
        Check("contract: memory round trip", _check_memory),
        Check("contract: kernels prepare/run on preallocated outputs, in place",
              lambda ctx: _check_kernels(ctx, selected)),
        Check("contract: kernels leave their inputs unchanged", lambda ctx: _check_inputs_untouched(ctx, selected)),
        Check("contract: bind() does what run() does, in place", lambda ctx: _check_bind(ctx, selected)),
        Check("contract: close() is idempotent", _check_close),
        *(Check(f"op {case.id}", _op_check(case)) for case in selected),
    ]


def check_backend(
    name: str, ops: Iterable[str] | None = None, *, on_result: Callable[[Result], None] | None = None
) -> Report:
    """Run every check against backend ``name``; ``ops`` limits the op cases (the contract checks always run)."""
    report = Report(name)
    ctx = Context(name)
    try:
        for check in plan(ops):
            result = check.run(ctx)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        ctx.close()
    return report


def run(backend: str, ops: Iterable[str] | None = None, *, verbose: bool = True) -> Report:
    """``check_backend`` for tests: prints each result and raises ``AssertionError`` listing the failures."""
    report = check_backend(backend, ops, on_result=print if verbose else None)
    if verbose:
        print(report.summary())
    if not report.ok:
        raise AssertionError(
            f"backend {backend} fails {len(report.failures)} conformance check(s):\n"
            + "\n".join(f"  {r.check}: {r.reason}" for r in report.failures)
        )
    return report
