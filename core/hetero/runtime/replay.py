"""Replay: a steady-state run recorded once and then re-issued as a flat list of zero-argument calls.

Once a session has run twice with the same input signature, every intermediate tensor is a fixed view of the arena
and every kernel is prepared for those shapes, so the per-node work of the interpreter (shape keys, infer lookups,
allocation, liveness) is the same each time. What still changes from run to run is small: the feeds, and the graph
outputs (fresh arrays, since the caller keeps them). So the replay

* copies each run's feeds into buffers of its own (``Backend.write``: a numpy copy on the host, a queued write
  on a device) (a few bytes for an LLM step: ``input_ids``, ``past_len``), which
  makes every kernel input that derives from a feed fixed too;
* asks each kernel whose inputs and outputs are all fixed for a bound call (the optional ``bind(inputs, outputs)``
  method: a zero-argument callable doing ``run(inputs, outputs)`` on those exact buffers, typically the native
  function with its arguments already converted, or a list of such callables, e.g. one per device launch), else
  binds ``run`` to its argument lists;
* gives a kernel writing a small graph output (``OWN_OUTPUT_BYTES``, host memory) buffers of the replay's own, so
  that it binds too, and hands the caller a copy of each at the end of the run (a few bytes: silero-vad's state and
  probability, cheaper than running the kernel through Python);
* keeps the rest (kernels writing larger graph outputs, views of them) as small dynamic entries;
* inlines an If whose condition follows from the input shapes (so the same branch each run: the executor checks)
  when its branch's child session replays in full (every call bound, every result in a buffer of its own, host
  memory): the parent copies the values the body reads into the body replay's input buffers and issues the body's
  calls as its own; the body's result buffers become the If's outputs. Otherwise such an If runs through its
  kernel's ``run_dynamic`` with the branch's child session (which replays itself), the results copied into buffers
  of the replay's own so that the kernels after it stay bound. Results of another shape than recorded raise
  ``StaleReplay``: the program then drops the replay and interprets.
* runs a Loop (its body free of state: the executor checks) through its kernel's ``run_dynamic`` at each run, as
  an If above: its body's child session replays each iteration itself; results of another shape than recorded (a
  step count that follows the data) raise ``StaleReplay``.
* runs an If whose condition comes from the data (its branches declaring the same static output shapes: the
  executor checks) by reading the condition at each run and issuing the taken branch's own replay, when its child
  session has recorded one that could be inlined (values in, results copied out); else through ``run_dynamic``.

* lets the backend merge consecutive bound calls (the optional ``fuse_calls(program) -> program``: the cpu plugin
  fuses a decode step's q / k / v matmuls, gate + up + SwiGLU, and residual adds into the matmul before them), and
  calls the backend's optional ``after_replay()`` after each run (the cpu plugin keeps its pool's workers spinning
  into the next run).

A run is then a copy per feed and one Python call per kernel: that keeps Python's share of an LLM decode step
small (issue 5 item 4; ``hetero.llm.profile`` measures it).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract.backend import Backend, HostMemory, Kernel
from ..contract.errors import HeteroError
from ..contract.tensor import Tensor, TensorInfo, static_shape

Key = tuple[str, Any]  # ("feed", input name) or ("var", id of the tensor in the recorded run)
# Graph outputs up to this size are computed into the replay's own buffers and copied out (see the module doc).
OWN_OUTPUT_BYTES = 64 * 1024
Call = Callable[[], Any]


@dataclass
class _Call:
    kernel: Kernel
    ins: list[Tensor | None]
    outs: list[Tensor]
    var_ins: list[tuple[int, Key]] = field(default_factory=list)
    fresh_outs: list[tuple[int, Key, Backend, TensorInfo]] = field(default_factory=list)
    # the shapes the kernel was prepared for when recorded (an unbound call needs them again: prepare_kernels)
    prepared: tuple[list[TensorInfo | None], list[TensorInfo]] | None = None
    # value inputs that follow the data (a Slice at a Loop body's step counter): the kernel reads them at each run
    # and raises when they give other output shapes than recorded (``values_at_run``), which ends the replay
    guarded: bool = False


@dataclass
class _Control:
    """A control-flow node (If) run through its kernel's ``run_dynamic`` with a subgraph runner made each run."""

    kernel: Any
    ins: list[Tensor | None]
    outer: dict[str, Tensor]  # enclosing-scope values its bodies read
    outs: list[tuple[Key, TensorInfo]]
    runner: Callable[[list[str], dict[str, Tensor]], Any]  # ControlFlow.runner
    backend: Backend
    var_ins: list[tuple[int, Key]] = field(default_factory=list)
    var_outer: list[tuple[str, Key]] = field(default_factory=list)
    fixed_outs: dict[Key, Tensor] = field(default_factory=dict)  # made by the replay: key -> its buffer
    # the taken branch's replay (recorded by its child session in this run) and the branch's output names
    body: tuple[Replay, list[str]] | None = None
    # an If whose condition comes from the data: the program of the branch a condition takes (its child session's
    # one segment, whose replay the replay issues directly instead of running the child session) and the branch's
    # output names, once that child exists; found once per branch (``branches``, by the condition's value)
    branch_of: Callable[[Tensor], tuple[Any, list[str]] | None] | None = None
    branches: dict[bool, _Branch] = field(default_factory=dict)


@dataclass
class _Branch:
    """One branch of a data-dependent If as the replay issues it: the branch's program (its ``replay`` read at each
    run: the child may record again) and, once checked to fit this If (inlinable, the values it reads of the
    recorded shapes, every result in a buffer of its own), that replay, its input copies and its result buffers."""

    program: Any
    names: list[str]
    replay: Replay | None = None
    copies: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (the body's input buffer, outer name)
    results: list[Tensor] = field(default_factory=list)
    # where the values the branch reads are fixed tensors (the If reads none of this run's values): the whole issue
    # made once, the backend's synchronize if it has one, byte copies into the body's input buffers (_copy_call) and
    # the body's calls (oww_hey_jarvis' one If: 1.5 us of glue around a 0.6 us body)
    calls: list[Call] | None = None
    # with numpy buffers: per If output (its key, the copy into the replay's buffer of it, or None: a fresh copy of
    # the result handed on, the run's own), the result; checked once against the recorded shapes (else None: the
    # per-run path, which raises StaleReplay on a shape it does not fit)
    hand_out: list[tuple[Key, Call | None, Tensor]] | None = None


class StaleReplay(HeteroError):
    """A replayed control-flow node produced shapes other than the recorded run's: the replay no longer applies."""


@dataclass
class _View:
    """A reshape-like node whose input was not fixed when recorded: its output is a view made at build or run."""

    src: Key
    out: Key
    info: TensorInfo
    backend: Backend


class Recorder:
    """Collects one planned run; ``build`` turns it into a Replay."""

    def __init__(self, feeds: dict[str, Tensor], backend: Backend) -> None:
        self.feeds = dict(feeds)
        self.backend = backend  # whose memory the replay's own input buffers are in
        self.keys: dict[int, Key] = {id(t): ("feed", name) for name, t in feeds.items()}
        self.entries: list[_Call | _View | _Control] = []
        self.keep: list[Tensor] = list(feeds.values())  # keeps ids unique while recording

    def _key(self, tensor: Tensor | None) -> Key | None:
        return None if tensor is None else self.keys.get(id(tensor))

    def call(self, kernel: Kernel, ins: list[Tensor | None], outs: list[Tensor], fresh: list[bool],
             infos: list[TensorInfo], backend: Backend, value_inputs: Sequence[int] = (),
             guarded: bool = False) -> None:
        """``value_inputs``: positions whose values the kernel reads when it binds (Slice's ends, Reshape's shape).
        They follow from the input shapes (the executor checks), but an arena slot holding one may be reused by a
        later node before the replay binds: such an input is bound to a copy taken now. A ``guarded`` call reads its
        value inputs at each run instead (its producers write them earlier in the same run)."""
        prepared = ([None if t is None else t.info for t in ins], list(infos))
        entry = _Call(kernel, list(ins), list(outs), prepared=prepared, guarded=guarded)
        for pos, tensor in enumerate(ins):
            key = self._key(tensor)
            if key is not None:
                entry.var_ins.append((pos, key))
            elif tensor is not None and pos in value_inputs and not guarded:
                entry.ins[pos] = own_copy(backend, tensor)
        for pos, (tensor, is_fresh) in enumerate(zip(outs, fresh, strict=True)):
            if is_fresh:
                key = ("var", id(tensor))
                self.keys[id(tensor)] = key
                self.keep.append(tensor)
                entry.fresh_outs.append((pos, key, backend, infos[pos]))
        self.entries.append(entry)

    def control(self, kernel: Any, ins: list[Tensor | None], outer: dict[str, Tensor], outs: list[Tensor],
                runner: Callable[[list[str], dict[str, Tensor]], Any], backend: Backend,
                body: tuple[Replay, list[str]] | None = None,
                branch_of: Callable[[Tensor], tuple[Any, list[str]] | None] | None = None) -> None:
        entry = _Control(kernel, list(ins), dict(outer), [], runner, backend, body=body, branch_of=branch_of)
        entry.var_ins = [(pos, k) for pos, t in enumerate(ins) if (k := self._key(t)) is not None]
        entry.var_outer = [(name, k) for name, t in outer.items() if (k := self._key(t)) is not None]
        for tensor in outs:  # keyed after the inputs: an output is never one of them
            key: Key = ("var", id(tensor))
            self.keys[id(tensor)] = key
            self.keep.append(tensor)
            entry.outs.append((key, tensor.info))
        self.entries.append(entry)

    def view(self, src: Tensor, out: Tensor, backend: Backend) -> None:
        key = self._key(src)
        if key is None:
            return  # a view of a fixed tensor (arena, weight) is itself fixed
        self.keys[id(out)] = ("var", id(out))
        self.keep.append(out)
        self.entries.append(_View(key, ("var", id(out)), out.info, backend))

    def build(self, signature: Any, outputs: dict[str, Tensor]) -> Replay:
        resolved = {name: self.keys.get(id(t), t) for name, t in outputs.items()}
        return Replay(signature, self.feeds, self.entries, resolved, self.backend)


class Replay:
    def __init__(self, signature: Any, feeds: dict[str, Tensor], entries: list[_Call | _View | _Control],
                 outputs: dict[str, Key | Tensor], backend: Backend) -> None:
        self.signature = signature
        self.outputs = outputs
        self._values: dict[Key, Tensor] = {}  # this run's feeds, fresh outputs and their views
        # Tensors made once: the replay's copies of the feeds and views of them, which a segment may pass on as an
        # output that a later segment reads (a segment of one Unsqueeze between two others).
        self._fixed: dict[Key, Tensor] = {}
        fixed = self._fixed
        self._write = backend.write
        # plain host buffers written by numpy copies: what run_arrays needs
        self._numpy_buffers = _numpy_buffers(backend)
        self._slots: list[tuple[str, Tensor]] = []  # (feed name, the replay's own buffer)
        for name, tensor in feeds.items():
            own = fixed[("feed", name)] = own_copy(backend, tensor)
            self._slots.append((name, own))
        self.program: list[Call] = []
        self.bound = 0  # kernels called through their own bind()
        self._unbound: list[_Call] = []  # kernels whose run() it calls: prepared again by prepare_kernels
        self._output_keys = {key for key in outputs.values() if not isinstance(key, Tensor)}
        self._owned: dict[Key, Backend] = {}  # graph outputs in the replay's own buffers: copied out each run
        self._bodies: list[Replay] = []  # If branches inlined into this replay
        self._dynamic = 0  # entries that read this run's values (feeds, fresh outputs): not inlinable
        self._reads_feeds = False  # an entry reads this run's feed tensors themselves (run_arrays has none)
        for entry in entries:
            if isinstance(entry, _View):
                self._add_view(entry, fixed)
            elif isinstance(entry, _Control):
                self._add_control(entry, fixed)
            else:
                self._add_call(entry, fixed)
        # The backend may merge consecutive bound calls into fewer (the cpu plugin: a decode step's matmuls), each
        # merged call doing exactly what the calls it replaces did.
        fuse = getattr(backend, "fuse_calls", None)
        if fuse is not None:
            self.program = fuse(self.program)
        self._after_run: Callable[[], Any] | None = getattr(backend, "after_replay", None)
        # run_arrays' fixed work looked up once (at tens of microseconds a run, its dict lookups and isinstance
        # checks were a tenth of a one-node model's run): the input buffers' arrays, and per graph output the buffer
        # of the replay's own it copies, else the fixed tensor or this run's value it hands out
        self._slot_arrays = [(name, own.buffer) for name, own in self._slots]
        self._array_outputs = {name: self._array_output(found) for name, found in outputs.items()}

    def _array_output(self, found: Key | Tensor) -> tuple[np.ndarray | None, Key | Tensor]:
        """How ``run_arrays`` hands out a graph output: (a buffer of the replay's own to copy, its key), else (None, a
        fixed tensor, or the key of a value of this run, else of a fixed tensor)."""
        return (self._fixed[found].buffer if not isinstance(found, Tensor) and found in self._owned else None), found

    def _add_view(self, entry: _View, fixed: dict[Key, Tensor]) -> None:
        # Graph outputs are never views (the session runs their reshape as a kernel), so a view of a fixed tensor
        # (e.g. of the replay's copy of a feed) only ever reaches kernels: made once here.
        src = fixed.get(entry.src)
        if entry.out in self._output_keys:
            # a segment output that is a view of a segment input (a reshape alone in its segment): made from this
            # run's feed at each run, never the replay's own copy of it (which the next run overwrites)
            self.program.append(functools.partial(_make_view, self._values, entry))
            self._dynamic += 1
            self._reads_feeds |= entry.src[0] == "feed"
            return
        view = None if src is None else entry.backend.view(src, entry.info)
        if view is not None:
            fixed[entry.out] = view
        else:
            self.program.append(functools.partial(_make_view, self._values, entry))
            self._dynamic += 1
            self._reads_feeds |= entry.src[0] == "feed"

    def _add_control(self, entry: _Control, fixed: dict[Key, Tensor]) -> None:
        entry.var_ins = _take_fixed(entry.var_ins, fixed, entry.ins)
        entry.var_outer = _take_fixed(entry.var_outer, fixed, entry.outer)
        if self._inline(entry, fixed):
            return
        self._dynamic += 1
        for key, info in entry.outs:
            if key not in self._output_keys:  # a graph output stays the run's own result (the caller keeps it)
                own = fixed[key] = entry.backend.empty(info)
                entry.fixed_outs[key] = own
        self.program.append(functools.partial(_run_control, self._values, entry))

    def _add_call(self, entry: _Call, fixed: dict[Key, Tensor]) -> None:
        ins = list(entry.ins)
        var_ins = _take_fixed(entry.var_ins, fixed, ins)
        kernel = entry.kernel
        if entry.guarded:  # never bound: its kernel reads this run's values
            # Its outputs of the recorded shapes (the kernel raises on others): buffers of the replay's own, written
            # at each run, so that the calls reading them bind (a NonZero's result, fresh in the recorded run).
            outs, fresh = list(entry.outs), []
            for pos, key, backend, info in entry.fresh_outs:
                if key in self._output_keys or backend.memory_domain != "host" or not info.is_static:
                    fresh.append((pos, key, backend, info))
                else:
                    outs[pos] = fixed[key] = backend.empty(info)
            guarded = _Call(kernel, ins, outs, var_ins, fresh, guarded=True)
            bind = getattr(kernel, "bind_guarded", None)
            call = bind(ins, outs) if bind is not None and not var_ins and not fresh else None
            if call is not None:  # every buffer fixed: the kernel's own call, which checks the values itself
                self.program.append(functools.partial(_call_guarded, call, type(kernel).__name__))
                return
            self.program.append(functools.partial(_run_guarded, self._values, guarded))
            self._unbound.append(entry)
            if var_ins or fresh:
                self._dynamic += 1
            return
        if not var_ins and entry.fresh_outs and all(_ownable(b, info) for _, _, b, info in entry.fresh_outs):
            outs = list(entry.outs)
            for pos, key, backend, info in entry.fresh_outs:
                outs[pos] = fixed[key] = backend.empty(info)
                self._owned[key] = backend
            entry = _Call(kernel, ins, outs, [], [], entry.prepared)
        if var_ins or entry.fresh_outs:
            dynamic = _Call(kernel, ins, list(entry.outs), var_ins, entry.fresh_outs)
            self.program.append(functools.partial(_run_dynamic, self._values, dynamic))
            self._unbound.append(entry)
            self._dynamic += 1
            return
        bind = getattr(kernel, "bind", None)
        call = bind(ins, entry.outs) if bind is not None else None
        if call is None:
            self.program.append(functools.partial(kernel.run, ins, entry.outs))
            self._unbound.append(entry)
            return
        self.bound += 1
        if callable(call):
            self.program.append(call)
        else:  # a kernel of several device launches binds each
            self.program.extend(call)

    def _inline(self, entry: _Control, fixed: dict[Key, Tensor]) -> bool:
        """Issues the taken branch's replay as part of this one (see the module doc); False where it cannot."""
        if entry.body is None or entry.var_outer or entry.backend.memory_domain != "host":
            return False
        body, names = entry.body
        results = [body.fixed_output(name) for name in names]
        if not body.inlinable or len(results) != len(entry.outs):
            return False
        # the values the body reads may still be being written by a device's queued work (metal): wait first
        if not _fits_slots(body, entry.outer):
            return False
        copies = _copies_in(entry.backend, [(slot.buffer, entry.outer[name].buffer) for name, slot in body._slots])
        for (_, info), result in zip(entry.outs, results, strict=True):
            if result is None or result.shape != info.shape or result.dtype != info.dtype:
                return False
        for (key, _), result in zip(entry.outs, results, strict=True):
            assert result is not None
            fixed[key] = result
            if key in self._output_keys:  # a graph output: the caller gets a copy
                self._owned[key] = entry.backend
        self.program.extend(copies)
        self.program.extend(body.program)
        self.bound += body.bound
        self._bodies.append(body)
        return True

    @property
    def inlinable(self) -> bool:
        """Whether a parent replay may issue this one's calls as its own: every call bound (it holds its buffers),
        none reads this run's values, every output a buffer of the replay's own."""
        return not self._dynamic and not self._unbound and all(
            self.fixed_output(name) is not None for name in self.outputs)

    def fixed_output(self, name: str) -> Tensor | None:
        """The buffer that holds output ``name`` after every run (None: a fresh tensor each run, or no such output)."""
        found = self.outputs.get(name)
        if found is None or isinstance(found, Tensor):
            return found
        return self._fixed.get(found)

    def prepare_kernels(self) -> None:
        """Prepares the kernels whose ``run`` the replay calls for the recorded shapes again: the program calls it
        when it comes back to this replay after running other shapes (a bound call holds what it needs)."""
        for entry in self._unbound:
            if entry.prepared is not None:
                entry.kernel.prepare(*entry.prepared)
        for body in self._bodies:
            body.prepare_kernels()

    def run(self, feeds: dict[str, Tensor], wanted: Sequence[str]) -> dict[str, Tensor]:
        values = self._values
        values.clear()
        write = self._write
        for name, slot in self._slots:
            tensor = feeds[name]
            write(slot, tensor)
            values["feed", name] = tensor
        for call in self.program:
            call()
        if self._after_run is not None:
            self._after_run()
        result = {}
        for name in wanted:
            found = self.outputs[name]
            if not isinstance(found, Tensor):
                backend = self._owned.get(found)
                if backend is not None:  # the replay's own buffer: the caller gets a copy
                    backend.synchronize()  # of what the device's queued work wrote (a no-op on the cpu)
                    found = own_copy(backend, self._fixed[found])
                else:
                    found = values[found] if found in values else self._fixed[found]
            result[name] = found
        values.clear()  # the caller owns the outputs now
        return result

    @property
    def takes_arrays(self) -> bool:
        """Whether ``run_arrays`` may run it: host buffers (written by numpy copies), no entry reading the feed
        tensors themselves."""
        return self._numpy_buffers and not self._reads_feeds

    def run_arrays(self, feeds: dict[str, np.ndarray], wanted: Sequence[str],
                   kept: Container[str] = ()) -> list[np.ndarray]:
        """``run`` for feeds that are numpy arrays of the recorded shapes and dtypes (the caller checked them) on a
        replay that ``takes_arrays``: the outputs as numpy arrays in ``wanted`` order, each the caller's own (a copy
        of a buffer of the replay's, else a fresh result). The session's fast path for repeated calls. ``kept``:
        feeds whose values the input buffers hold from the last run (a Loop's carried weights): not copied again
        (nothing but this copy writes an input buffer: kernels write the arena and their own outputs)."""
        values = self._values
        values.clear()
        for name, buffer in self._slot_arrays:
            if name not in kept:
                buffer[...] = feeds[name]  # same shape and dtype (checked): np.copyto's work, called faster
        for call in self.program:
            call()
        if self._after_run is not None:
            self._after_run()
        result = []
        outputs = self._array_outputs
        for name in wanted:
            own, found = outputs[name]
            if own is not None:
                result.append(own.copy())
            elif isinstance(found, Tensor):
                result.append(found.numpy())
            else:
                result.append((values[found] if found in values else self._fixed[found]).numpy())
        values.clear()
        return result


def own_copy(backend: Backend, tensor: Tensor) -> Tensor:
    """A tensor of ``backend`` holding ``tensor``'s values now, which later runs cannot overwrite."""
    buffer = tensor.buffer
    if type(buffer) is np.ndarray and _numpy_buffers(backend) and tensor.is_host and buffer.shape == tensor.shape \
            and buffer.dtype == tensor.dtype.np_dtype:  # what empty() + write() make, in one call
        return Tensor.of_layout(buffer.copy(), tensor.shape, tensor.dtype, backend)
    own = backend.empty(tensor.info)
    backend.write(own, tensor)
    return own


def _copies_in(backend: Backend, pairs: list[tuple[Any, Any]]) -> list[Call]:
    """Calls that wait for ``backend``'s queued work (its values may still be being written), then copy each
    ``(dst, src)`` of ``pairs``; a host backend's ``synchronize`` is the base class's no-op and is left out (50 ns a
    call: silero-vad's Ifs made six a run)."""
    calls: list[Call] = [] if type(backend).synchronize is Backend.synchronize else [backend.synchronize]
    return calls + [_copy_call(dst, src) for dst, src in pairs]


def _copy_call(dst: Any, src: Any) -> Call:
    """A call copying ``src`` into ``dst``, both buffers fixed for the replay's life (of the same shape and dtype:
    ``_fits_slots``): a byte copy between memoryviews made once where both are contiguous numpy arrays of plain data
    (0.1 us against np.copyto's 0.3 on the small values an inlined If's body reads; silero-vad copies 11 a run), else
    np.copyto."""
    if type(dst) is np.ndarray and type(src) is np.ndarray and dst.dtype == src.dtype and dst.shape == src.shape \
            and not dst.dtype.hasobject and dst.flags.c_contiguous and src.flags.c_contiguous:
        try:
            into, source = dst.data.cast("B"), src.data.cast("B")
        except (TypeError, ValueError):  # a dtype the buffer protocol does not describe (datetime, structured)
            pass
        else:
            return functools.partial(operator.setitem, into, slice(None), source)
    return functools.partial(np.copyto, dst, src)


def _numpy_buffers(backend: Backend) -> bool:
    """Whether ``backend``'s tensors are numpy arrays of their own shape and dtype, written by numpy copies, and its
    kernels done when they return (no ``synchronize`` of its own: metal's queued work is not)."""
    cls = type(backend)
    found = _NUMPY_BUFFER_CLASSES.get(cls)
    if found is None:
        found = _NUMPY_BUFFER_CLASSES[cls] = isinstance(backend, HostMemory) and cls.write is HostMemory.write \
            and cls.empty is HostMemory.empty and cls.synchronize is Backend.synchronize
    return found


_NUMPY_BUFFER_CLASSES: dict[type, bool] = {}  # by backend class: _numpy_buffers is on the replay's hot path


def _ownable(backend: Backend, info: TensorInfo) -> bool:
    """Whether a graph output of ``info`` is small enough, and in host memory, to be computed into a buffer of the
    replay's own and copied out at each run."""
    if backend.memory_domain != "host" or info.dtype.np_dtype is None or not info.is_static:
        return False
    return info.dtype.nbytes(int(np.prod(static_shape(info), dtype=np.int64))) <= OWN_OUTPUT_BYTES


def _take_fixed(slots: list[tuple[Any, Key]], fixed: dict[Key, Tensor], target: Any) -> list[tuple[Any, Key]]:
    """Puts each slot's tensor into ``target[slot]`` where it is fixed; returns the slots left to fill at each run."""
    left = []
    for slot, key in slots:
        if key in fixed:
            target[slot] = fixed[key]
        else:
            left.append((slot, key))
    return left


def _make_view(values: dict[Key, Tensor], entry: _View) -> None:
    view = entry.backend.view(values[entry.src], entry.info)
    assert view is not None  # it made one when recorded, for the same shapes
    values[entry.out] = view


def _run_dynamic(values: dict[Key, Tensor], entry: _Call) -> None:
    for pos, key in entry.var_ins:
        entry.ins[pos] = values[key]
    for pos, key, backend, info in entry.fresh_outs:
        values[key] = entry.outs[pos] = backend.empty(info)
    entry.kernel.run(entry.ins, entry.outs)


def _run_guarded(values: dict[Key, Tensor], entry: _Call) -> None:
    """A call whose kernel reads its value inputs now (``values_at_run``); its failure (values giving other output
    shapes than recorded, on which the rest of the replay depends) ends the replay: the program interprets."""
    ins = entry.ins
    for pos, key in entry.var_ins:
        ins[pos] = values[key]
    for pos, key, backend, info in entry.fresh_outs:
        values[key] = entry.outs[pos] = backend.empty(info)
    try:
        entry.kernel.run(ins, entry.outs)
    except (HeteroError, ValueError, IndexError, RuntimeError) as exc:
        raise StaleReplay(f"a guarded call of {type(entry.kernel).__name__}: {exc}") from exc


def _call_guarded(call: Call, name: str) -> None:
    """A guarded step's bound call (``bind_guarded``): as ``_run_guarded``, its failure ends the replay."""
    try:
        call()
    except (HeteroError, ValueError, IndexError, RuntimeError) as exc:
        raise StaleReplay(f"a guarded call of {name}: {exc}") from exc


def _run_control(values: dict[Key, Tensor], entry: _Control) -> None:
    for pos, key in entry.var_ins:
        entry.ins[pos] = values[key]
    for name, key in entry.var_outer:
        entry.outer[name] = values[key]
    branch = _run_branch_replay(entry)
    if branch is not None and branch.hand_out is not None:
        backend = entry.backend
        for key, copy, result in branch.hand_out:
            if copy is None:  # own_copy's work, checked once (_fit_branch)
                values[key] = Tensor.of_layout(result.buffer.copy(), result.shape, result.dtype, backend)
            else:
                copy()
        return
    outs = None if branch is None else branch.results
    borrowed = outs is not None  # the branch replay's own buffers, which its next run overwrites
    if outs is None:
        outs = entry.kernel.run_dynamic(entry.ins, run_subgraph=entry.runner(list(entry.outer), entry.outer))
    owned = entry.fixed_outs
    for (key, _), out in zip(entry.outs, outs, strict=True):
        own = owned.get(key)
        if own is None:
            values[key] = own_copy(entry.backend, out) if borrowed else out
        elif out.shape != own.shape or out.dtype != own.dtype:
            raise StaleReplay(f"{entry.kernel.node.label()}: a result of shape {list(out.shape)} where the recorded "
                              f"run had {list(own.shape)}")
        else:
            entry.backend.write(own, out)


def _fits_slots(body: Replay, outer: dict[str, Tensor]) -> bool:
    """Whether the enclosing scope holds, in host memory, every value a branch's replay reads, of the shapes and
    dtypes it recorded (so that they can be copied into its input buffers)."""
    for name, slot in body._slots:
        src = outer.get(name)
        if src is None or not src.is_host or src.shape != slot.shape or src.dtype != slot.dtype:
            return False
    return True


def _run_branch_replay(entry: _Control) -> _Branch | None:
    """A data-dependent If run by issuing its taken branch's replay directly (the values it reads copied into that
    replay's input buffers), without the child session's run: the branch, whose results are that replay's buffers,
    which the caller copies (the next run of the branch overwrites them); None where the branch has no such replay
    yet or its recorded shapes differ from this run's. The parent replay's shapes are fixed, so a branch's replay
    checked once to fit stays fit while the child keeps it."""
    cond = entry.ins[0]
    if entry.branch_of is None or cond is None or entry.backend.memory_domain != "host":
        return None
    flag = bool(cond.host_values().item(0))
    branch = entry.branches.get(flag)
    if branch is None:
        found = entry.branch_of(cond)
        if found is None:
            return None
        branch = entry.branches[flag] = _Branch(*found)
    body = branch.program.replay
    if body is None:
        return None
    if body is not branch.replay and not _fit_branch(branch, body, entry):
        return None
    if branch.calls is not None:
        for call in branch.calls:
            call()
        return branch
    entry.backend.synchronize()
    outer = entry.outer
    for buffer, name in branch.copies:
        buffer[...] = outer[name].buffer  # same shape and dtype (_fits_slots)
    for call in body.program:
        call()
    return branch


def _fit_branch(branch: _Branch, body: Replay, entry: _Control) -> bool:
    """Checks that ``body`` (the branch program's replay now) can be issued by the If (see ``_Branch``); keeps it."""
    outer = entry.outer
    if not body.inlinable or not _fits_slots(body, outer):
        return False
    results = [body.fixed_output(name) for name in branch.names]
    if any(r is None for r in results):
        return False
    branch.replay, branch.results = body, [r for r in results if r is not None]
    branch.copies = [(slot.buffer, name) for name, slot in body._slots]
    branch.calls = None
    if not entry.var_outer:  # entry.outer holds the same tensors at every run
        branch.calls = _copies_in(entry.backend, [(buffer, outer[name].buffer) for buffer, name in branch.copies])
        branch.calls += body.program
    branch.hand_out = _hand_out(entry, branch.results)
    return True


def _hand_out(entry: _Control, results: list[Tensor]) -> list[tuple[Key, Call | None, Tensor]] | None:
    """``_Branch.hand_out`` for the fitted ``results``, where the backend's buffers are numpy arrays; else None."""
    if not _numpy_buffers(entry.backend) or len(results) != len(entry.outs):
        return None
    found: list[tuple[Key, Call | None, Tensor]] = []
    for (key, _), result in zip(entry.outs, results, strict=True):
        buffer, own = result.buffer, entry.fixed_outs.get(key)
        if type(buffer) is not np.ndarray or buffer.shape != result.shape or buffer.dtype != result.dtype.np_dtype:
            return None
        if own is None:
            found.append((key, None, result))
        elif own.shape != result.shape or own.dtype != result.dtype:
            return None
        else:
            found.append((key, _copy_call(own.buffer, buffer), result))
    return found
