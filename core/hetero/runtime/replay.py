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
* keeps the rest (kernels writing graph outputs, views of them) as small dynamic entries.

A run is then a copy per feed and one Python call per kernel: that keeps Python's share of an LLM decode step
small (issue 5 item 4; ``hetero.llm.profile`` measures it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..contract.backend import Backend, Kernel
from ..contract.tensor import Tensor, TensorInfo

Key = tuple[str, Any]  # ("feed", input name) or ("var", id of the tensor in the recorded run)
Call = Callable[[], Any]


@dataclass
class _Call:
    kernel: Kernel
    ins: list[Tensor | None]
    outs: list[Tensor]
    var_ins: list[tuple[int, Key]] = field(default_factory=list)
    fresh_outs: list[tuple[int, Key, Backend, TensorInfo]] = field(default_factory=list)


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
        self.entries: list[_Call | _View] = []
        self.keep: list[Tensor] = list(feeds.values())  # keeps ids unique while recording

    def _key(self, tensor: Tensor | None) -> Key | None:
        return None if tensor is None else self.keys.get(id(tensor))

    def call(self, kernel: Kernel, ins: list[Tensor | None], outs: list[Tensor], fresh: list[bool],
             infos: list[TensorInfo], backend: Backend) -> None:
        entry = _Call(kernel, list(ins), list(outs))
        for pos, tensor in enumerate(ins):
            key = self._key(tensor)
            if key is not None:
                entry.var_ins.append((pos, key))
        for pos, (tensor, is_fresh) in enumerate(zip(outs, fresh, strict=True)):
            if is_fresh:
                key = ("var", id(tensor))
                self.keys[id(tensor)] = key
                self.keep.append(tensor)
                entry.fresh_outs.append((pos, key, backend, infos[pos]))
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
    def __init__(self, signature: Any, feeds: dict[str, Tensor], entries: list[_Call | _View],
                 outputs: dict[str, Key | Tensor], backend: Backend) -> None:
        self.signature = signature
        self.outputs = outputs
        self._values: dict[Key, Tensor] = {}  # this run's feeds, fresh outputs and their views
        # Tensors made once: the replay's copies of the feeds and views of them, which a segment may pass on as an
        # output that a later segment reads (a segment of one Unsqueeze between two others).
        self._fixed: dict[Key, Tensor] = {}
        fixed = self._fixed
        self._write = backend.write
        self._slots: list[tuple[str, Tensor]] = []  # (feed name, the replay's own buffer)
        for name, tensor in feeds.items():
            own = fixed[("feed", name)] = backend.empty(tensor.info)
            backend.write(own, tensor)
            self._slots.append((name, own))
        self.program: list[Call] = []
        self.bound = 0  # kernels called through their own bind()
        self._output_keys = {key for key in outputs.values() if not isinstance(key, Tensor)}
        for entry in entries:
            if isinstance(entry, _View):
                self._add_view(entry, fixed)
            else:
                self._add_call(entry, fixed)

    def _add_view(self, entry: _View, fixed: dict[Key, Tensor]) -> None:
        # Graph outputs are never views (the session runs their reshape as a kernel), so a view of a fixed tensor
        # (e.g. of the replay's copy of a feed) only ever reaches kernels: made once here.
        src = fixed.get(entry.src)
        if entry.out in self._output_keys:
            # a segment output that is a view of a segment input (a reshape alone in its segment): made from this
            # run's feed at each run, never the replay's own copy of it (which the next run overwrites)
            self.program.append(functools.partial(_make_view, self._values, entry))
            return
        view = None if src is None else entry.backend.view(src, entry.info)
        if view is not None:
            fixed[entry.out] = view
        else:
            self.program.append(functools.partial(_make_view, self._values, entry))

    def _add_call(self, entry: _Call, fixed: dict[Key, Tensor]) -> None:
        ins = list(entry.ins)
        var_ins = []
        for pos, key in entry.var_ins:
            if key in fixed:
                ins[pos] = fixed[key]
            else:
                var_ins.append((pos, key))
        kernel = entry.kernel
        if var_ins or entry.fresh_outs:
            dynamic = _Call(kernel, ins, list(entry.outs), var_ins, entry.fresh_outs)
            self.program.append(functools.partial(_run_dynamic, self._values, dynamic))
            return
        bind = getattr(kernel, "bind", None)
        call = bind(ins, entry.outs) if bind is not None else None
        if call is None:
            self.program.append(functools.partial(kernel.run, ins, entry.outs))
            return
        self.bound += 1
        if callable(call):
            self.program.append(call)
        else:  # a kernel of several device launches binds each
            self.program.extend(call)

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
        result = {}
        for name in wanted:
            found = self.outputs[name]
            if not isinstance(found, Tensor):
                found = values[found] if found in values else self._fixed[found]
            result[name] = found
        values.clear()  # the caller owns the outputs now
        return result


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
