"""Replay: a steady-state run recorded once and then re-issued as a flat list of kernel calls.

Once a session has run twice with the same input shapes, every intermediate tensor is a fixed view of the arena and
every kernel is prepared for those shapes, so the per-node work of the interpreter (shape keys, infer lookups,
allocation, liveness) is the same each time. The replay keeps, per node, the kernel's ``run`` and its input and
output lists; a run only swaps in the new feeds and freshly allocated graph outputs, then calls the kernels. That
keeps Python's share of an LLM decode step small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backend import Backend
from ..tensor import Tensor, TensorInfo

Key = tuple[str, Any]  # ("feed", input name) or ("var", id of the tensor in the recorded run)


@dataclass
class _Call:
    run: Callable[[Sequence[Tensor | None], Sequence[Tensor]], None]
    ins: list[Tensor | None]
    outs: list[Tensor]
    var_ins: list[tuple[int, Key]] = field(default_factory=list)
    fresh_outs: list[tuple[int, Key, Backend, TensorInfo]] = field(default_factory=list)


@dataclass
class _View:
    """A reshape-like node whose input changes every run: its output is re-made as a view."""

    src: Key
    out: Key
    info: TensorInfo
    backend: Backend


class Recorder:
    """Collects one planned run; ``build`` turns it into a Replay."""

    def __init__(self, feeds: dict[str, Tensor]) -> None:
        self.keys: dict[int, Key] = {id(t): ("feed", name) for name, t in feeds.items()}
        self.entries: list[_Call | _View] = []
        self.keep: list[Tensor] = list(feeds.values())  # keeps ids unique while recording

    def _key(self, tensor: Tensor | None) -> Key | None:
        return None if tensor is None else self.keys.get(id(tensor))

    def call(self, run: Callable, ins: list[Tensor | None], outs: list[Tensor], fresh: list[bool],
             infos: list[TensorInfo], backend: Backend) -> None:
        entry = _Call(run, list(ins), list(outs))
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
        return Replay(signature, self.entries, resolved)


class Replay:
    def __init__(self, signature: Any, entries: list[_Call | _View], outputs: dict[str, Key | Tensor]) -> None:
        self.signature = signature
        self.entries = entries
        self.outputs = outputs

    def run(self, feeds: dict[str, Tensor], wanted: Sequence[str]) -> dict[str, Tensor]:
        values: dict[Key, Tensor] = {("feed", name): t for name, t in feeds.items()}
        for entry in self.entries:
            if isinstance(entry, _View):
                view = entry.backend.view(values[entry.src], entry.info)
                assert view is not None  # it made one when recorded, for the same shapes
                values[entry.out] = view
                continue
            for pos, key in entry.var_ins:
                entry.ins[pos] = values[key]
            for pos, key, backend, info in entry.fresh_outs:
                values[key] = entry.outs[pos] = backend.empty(info)
            entry.run(entry.ins, entry.outs)
        result = {}
        for name in wanted:
            found = self.outputs[name]
            result[name] = found if isinstance(found, Tensor) else values[found]
        return result
