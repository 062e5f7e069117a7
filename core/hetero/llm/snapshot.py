"""A sequence's computed prefix as arrays: the KV cache rows ``[0, n)`` of every Attention node and the recurrent
state at ``n`` of every GatedDeltaRule node, taken from one model and put into another (or the same one later).
What a prefix cache keeps (``hetero.llm.prefix_cache``): a prompt computed once, its prefix reused by the next
request that starts the same way without computing it again.

The kernels do the copying (optional kernel methods, see ``hetero.contract.backend.Kernel``):
``export_state(slot, length) -> dict[str, np.ndarray]`` and ``import_state(slot, length, state)``. A snapshot is
plain data — the tokens, and per stateful node a dict of numpy arrays in its kernel's own layout, with the KV cache
type — written to a file by ``save`` (a numpy ``.npz``) and read back by ``load``, for the same model and backend
(``restore`` checks the model, the kernels the shapes and cache type).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.errors import HeteroError

STATEFUL_OPS = ("Attention", "GatedDeltaRule")  # the ops of a decoder that keep a sequence's state
RECURRENT_OPS = ("GatedDeltaRule",)  # their state exists at one position: a snapshot cannot be cut shorter


@dataclass(frozen=True)
class Snapshot:
    """``tokens``' computed state: ``states[node name]`` is that node's kernel's ``export_state``. ``model``
    names what it fits (the model's name and KV cache type): another model's snapshot is refused."""

    tokens: tuple[int, ...]
    states: dict[str, dict[str, np.ndarray]]
    model: str
    recurrent: bool  # holds a recurrent state: only all of ``tokens`` can be restored, not a shorter prefix

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for state in self.states.values() for a in state.values())

    def usable(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` this snapshot can restore (0: none)."""
        common = common_prefix(self.tokens, prompt)
        if self.recurrent:
            return common if common == len(self.tokens) else 0
        return common


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


def _stateful(session: Any) -> list[tuple[str, Any]]:
    """(node name, kernel) of the session's stateful nodes; a kernel without the state methods is refused."""
    found = []
    for node, kernel in session.kernels():
        if node.op_type not in STATEFUL_OPS:
            continue
        if not callable(getattr(kernel, "export_state", None)) or not callable(getattr(kernel, "import_state", None)):
            backend = getattr(getattr(kernel, "backend", None), "name", type(kernel).__name__)
            raise HeteroError(f"node {node.name!r} ({node.op_type}) runs on {backend}, whose kernel cannot export "
                              "its state: no snapshots (prefix cache) for this model",
                              hint="load the model on the cpu backend")
        found.append((node.name, kernel))
    return found


def fingerprint(llm: Any) -> str:
    return f"{llm.name}|{llm.quant}|{llm.kv_cache}|{llm.config.num_layers}"


def export(llm: Any, slot: int, length: int) -> Snapshot:
    """The state of ``llm``'s first ``length`` cached tokens (called with the model's lock held)."""
    if not 0 < length <= len(llm.tokens):
        raise HeteroError(f"cannot snapshot {length} tokens: the cache holds {len(llm.tokens)}")
    nodes = _stateful(llm.session)
    states = {name: kernel.export_state(slot, length) for name, kernel in nodes}
    recurrent = any(node.op_type in RECURRENT_OPS for node, _ in llm.session.kernels())
    return Snapshot(tuple(llm.tokens[:length]), states, fingerprint(llm), recurrent)


def restore(llm: Any, slot: int, snapshot: Snapshot, length: int) -> None:
    """Make ``llm``'s cache hold ``snapshot``'s first ``length`` tokens (called with the model's lock held)."""
    if snapshot.model != fingerprint(llm):
        raise HeteroError(f"a snapshot of {snapshot.model.split('|')[0]!r} does not fit {llm.name!r} (model, "
                          "quantization, KV cache type and layers must match)")
    if not 0 < length <= len(snapshot.tokens) or (snapshot.recurrent and length != len(snapshot.tokens)):
        raise HeteroError(f"cannot restore {length} of a snapshot's {len(snapshot.tokens)} tokens"
                          + (" (a recurrent state restores whole)" if snapshot.recurrent else ""))
    nodes = _stateful(llm.session)
    missing = [name for name, _ in nodes if name not in snapshot.states]
    if missing:
        raise HeteroError(f"the snapshot has no state for node {missing[0]!r}")
    for name, kernel in nodes:
        kernel.import_state(slot, length, snapshot.states[name])


_META = ("__tokens__", "__model__", "__recurrent__")
_SEP = "::"  # between a node's name and its array's in a file's entries


def save(snap: Snapshot, path: str | Path) -> None:
    """Write ``snap`` to ``path`` (a numpy ``.npz``: the tokens, the model it fits, each node's arrays)."""
    arrays = {f"{node}{_SEP}{key}": value for node, state in snap.states.items() for key, value in state.items()}
    np.savez(path, __tokens__=np.asarray(snap.tokens, dtype=np.int64), __model__=np.array(snap.model),
             __recurrent__=np.array(snap.recurrent), **arrays)


def load(path: str | Path) -> Snapshot:
    """A snapshot written by ``save``; a file that is not one is a ``HeteroError`` naming it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            if not set(_META) <= set(names):
                raise HeteroError(f"{path}: not a hetero snapshot (it lacks {sorted(set(_META) - set(names))})")
            states: dict[str, dict[str, np.ndarray]] = {}
            for name in names:
                if name not in _META:
                    node, sep, key = name.rpartition(_SEP)
                    if not sep:
                        raise HeteroError(f"{path}: entry {name!r} is not 'node{_SEP}array'")
                    states.setdefault(node, {})[key] = data[name]
            tokens = data["__tokens__"]
            if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
                raise HeteroError(f"{path}: __tokens__ must be a 1-d integer array, got {tokens.dtype} {tokens.shape}")
            return Snapshot(tuple(int(t) for t in tokens), states, str(data["__model__"]),
                            bool(data["__recurrent__"]))
    except HeteroError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise HeteroError(f"{path}: not a readable snapshot file ({type(exc).__name__}: {exc})") from None


__all__ = ["RECURRENT_OPS", "STATEFUL_OPS", "Snapshot", "common_prefix", "export", "load", "restore", "save"]
