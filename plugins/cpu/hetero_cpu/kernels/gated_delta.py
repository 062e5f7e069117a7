"""``GatedDeltaRule`` (hetero.ops.gated_delta) on the native library: conv, gating, the recurrence (decode) or
the chunked WY/UT form (prompts), gated norm, value heads in parallel, on the ISA path chosen at run time.

The node's state lives here: the recurrent state (float32 ``[Hv, Dk, Dv]``), the input history (pre-conv rows
with K - 1 leading zero rows, so the conv window of any range is a slice; raw a / b rows) and the snapshots; the
rollback policy is the op's (snapshots every ``snapshot_interval`` positions and after every prompt, replay from
the newest one at or before the target, or the block-start checkpoint of the op's doc). ``run`` allocates only when
the history grows (doubling). A node serving several sequences (a ``slots`` input) keeps one such state per slot
(a kernel object each) and runs each one-sequence run of its rows on its slot's.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, Backend, HeteroError, NodeInfo, Support, Tensor, dtypes, unsupported
from hetero.contract.opforms import GATED_DELTA_MODES, gated_delta_restore_point, slot_runs

from .. import _native
from .common import CpuKernel, one_slot

# Below this many new tokens the recurrence runs, not the chunked form. The chunked form is 1.1-1.2x faster from 4
# tokens (benchmarks/gated_delta.py --tokens N at Qwen3.5's head size, AVX-512 and AVX2), but blocks of up to 16
# tokens are speculative verify steps (hetero.llm.speculative, VERIFY_ROWS): run as the recurrence their outputs
# and states are bitwise those of one-token decode steps, so greedy speculative output equals plain decoding.
# HETERO_CPU_GDN_CHUNKED_MIN overrides it (benchmarks).
CHUNKED_MIN = 17


def _c32(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.float32 and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=np.float32)


class CpuGatedDeltaRule(CpuKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        for i in (0, 2, 3):
            info = node.inputs[i]
            if info is None or info.dtype != dtypes.float32:
                return unsupported("GatedDeltaRule on non-float32 tensors")
        if 1 not in node.constants:
            return unsupported("GatedDeltaRule with a conv weight computed at run time")
        for i in (5, 6, 7, 9):
            if i < len(node.inputs) and node.inputs[i] is not None and i not in node.constants:
                return unsupported("GatedDeltaRule with conv_bias / a_log / dt_bias / norm_weight computed at run time")
        if str(node.attr("mode", "auto")) not in GATED_DELTA_MODES or int(node.attr("chunk_size", 64)) > 1024:
            return unsupported("GatedDeltaRule mode / chunk_size")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend: Backend) -> None:
        super().__init__(node, backend)
        a = node.node.attrs
        self.hk, self.hv = int(a["k_heads"]), int(a["v_heads"])
        self.dk, self.dv = int(a["k_dim"]), int(a["v_dim"])
        self.channels = 2 * self.hk * self.dk + self.hv * self.dv
        self.scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(self.dk)
        self.l2norm = bool(int(a.get("qk_l2norm", 1)))
        self.l2_eps = float(a.get("l2norm_eps", 1e-6))
        self.norm_eps = float(a.get("norm_eps", 1e-6))
        self.silu = str(a.get("conv_activation", "silu")) == "silu"
        self.chunk = int(a.get("chunk_size", 64))
        self.interval = int(a.get("snapshot_interval", 256))
        self.max_snapshots = max(int(a.get("max_snapshots", 8)), 1)
        self.max_context = int(a.get("max_context", 0))
        self.chunked_min = int(os.environ.get("HETERO_CPU_GDN_CHUNKED_MIN", CHUNKED_MIN))
        const = node.constants
        w = np.asarray(const[1], dtype=np.float32)
        self.conv_w = _c32(w.reshape(w.shape[0], -1))
        self.kernel = self.conv_w.shape[1]
        opt = (lambda i: None if i not in const else _c32(np.asarray(const[i]).reshape(-1)))  # noqa: E731
        self.conv_b, self.a_log, self.dt_bias, self.norm_w = opt(5), opt(6), opt(7), opt(9)
        self._fresh_state()
        self.slotted = len(node.inputs) > 10 and node.inputs[10] is not None
        self.slots = max(int(a.get("slots", 1)), 1)
        # slot -> the kernel object holding its state, all made now (a slot's prefill may export or import its
        # state while a batched step of the others runs)
        self.per_slot: list[CpuGatedDeltaRule] = [self]
        for _ in range(1, self.slots if self.slotted else 1):
            other = copy.copy(self)
            other._fresh_state()
            other.slotted, other.per_slot = False, [other]  # one sequence's state
            self.per_slot.append(other)

    def _fresh_state(self) -> None:
        """The state of a sequence at position 0."""
        self.state = np.zeros((self.hv, self.dk, self.dv), dtype=np.float32)
        self.pos = 0
        self.hist_x = np.zeros((self.kernel - 1 + 64, self.channels), dtype=np.float32)
        self.hist_a = np.zeros((64, self.hv), dtype=np.float32)
        self.hist_b = np.zeros((64, self.hv), dtype=np.float32)
        self.snaps: dict[int, np.ndarray] = {}
        self.block_pos = -1  # the block-start checkpoint: position (-1: none) and state
        self.block_state = np.zeros_like(self.state)

    def _of_slot(self, slot: int) -> CpuGatedDeltaRule:
        if self.slotted and 0 <= slot < self.slots:
            return self.per_slot[slot]
        one_slot(self.node.label(), slot)
        return self

    # -- state ----------------------------------------------------------------------------------------------------
    def _grow(self, end: int) -> None:
        cap = self.hist_a.shape[0]
        if end <= cap:
            return
        cap = max(end, 2 * cap)
        k = self.kernel - 1
        for name, rows in (("hist_x", cap + k), ("hist_a", cap), ("hist_b", cap)):
            old = getattr(self, name)
            new = np.zeros((rows, old.shape[1]), dtype=np.float32)
            new[:old.shape[0]] = old
            setattr(self, name, new)

    def _snapshot(self) -> None:
        self.snaps[self.pos] = self.state.copy()
        while len(self.snaps) > self.max_snapshots:
            del self.snaps[next(iter(self.snaps))]

    def _advance(self, start: int, end: int, out: np.ndarray | None, z: np.ndarray | None, chunked: bool) -> None:
        """Positions [start, end) from the state at start; out / z rows are those positions' (or None)."""
        pos = start
        while pos < end:
            stop = end
            if self.interval > 0:
                stop = min(end, (pos // self.interval + 1) * self.interval)
            i, j = pos - start, stop - start
            first = self.chunk - pos % self.chunk
            _native.gated_delta(
                self.hist_x[pos:stop + self.kernel - 1], self.conv_w, self.conv_b, self.hist_a[pos:stop],
                self.hist_b[pos:stop], self.a_log, self.dt_bias, None if z is None else z[i:j],
                self.norm_w if z is not None else None, self.state, None if out is None else out[i:j],
                self.hk, self.hv, self.dk, self.dv, self.chunk if chunked else 0, first, self.scale, self.l2norm,
                self.silu, self.l2_eps, self.norm_eps)
            self.pos = pos = stop
            if self.interval > 0 and stop % self.interval == 0:
                self._snapshot()

    def _rollback(self, target: int) -> None:
        if target == self.pos:
            return
        self.block_pos, base = gated_delta_restore_point(self.snaps, self.block_pos, target)
        if base in self.snaps:
            np.copyto(self.state, self.snaps[base])
        elif base > 0:  # the block-start checkpoint
            np.copyto(self.state, self.block_state)
        else:
            self.state.fill(0.0)
        self.pos = base
        if target > base:  # the same form a run of that many tokens takes (bitwise equal states for short replays)
            self._advance(base, target, None, None, target - base >= self.chunked_min)

    # -- the state as arrays (a prefix cache: hetero.llm.snapshot) --------------------------------------------------
    def export_state(self, slot: int, length: int) -> dict[str, np.ndarray]:
        """The recurrent state after positions [0, length) and their input history (copies). The state exists
        only where it stands now or at a kept snapshot: other lengths are refused."""
        if self._of_slot(slot) is not self:
            return self._of_slot(slot).export_state(0, length)
        if length == self.pos:
            state = self.state
        elif length in self.snaps:
            state = self.snaps[length]
        else:
            raise HeteroError(f"{self.node.label()}: no recurrent state at position {length} (it stands at "
                              f"{self.pos}; snapshots at {sorted(self.snaps)})")
        k = self.kernel - 1
        return {"state": state.copy(), "hist_x": self.hist_x[:length + k].copy(),
                "hist_a": self.hist_a[:length].copy(), "hist_b": self.hist_b[:length].copy()}

    def import_state(self, slot: int, length: int, state: dict[str, np.ndarray]) -> None:
        """Stand at position ``length`` with an ``export_state`` of exactly that length (a recurrent state cannot
        be cut shorter)."""
        if self._of_slot(slot) is not self:
            self._of_slot(slot).import_state(0, length, state)
            return
        k = self.kernel - 1
        shapes = {"state": self.state.shape, "hist_x": (length + k, self.channels), "hist_a": (length, self.hv),
                  "hist_b": (length, self.hv)}
        if any(getattr(state.get(name), "shape", None) != shape or state[name].dtype != np.float32
               for name, shape in shapes.items()):
            raise HeteroError(f"{self.node.label()}: the snapshot is not this node's float32 state at position "
                              f"{length}")
        self._grow(length)
        self.hist_x[:length + k] = state["hist_x"]
        self.hist_a[:length] = state["hist_a"]
        self.hist_b[:length] = state["hist_b"]
        np.copyto(self.state, state["state"])
        self.pos = length
        self.snaps = {}
        self.block_pos = -1
        self._snapshot()  # a later rollback to this position needs no replay

    # -- run ------------------------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, a, b, out = inputs[0].buffer, inputs[2].buffer, inputs[3].buffer, outputs[0].buffer
        z = inputs[8].buffer if len(inputs) > 8 and inputs[8] is not None else None
        if not self.slotted:
            self._step(x, a, b, int(inputs[4].buffer.reshape(-1)[0]), z, out)
            return
        for run in slot_runs(self.node.label(), inputs[4].buffer, inputs[10].buffer, self.slots):
            i, j = run.start, run.end
            self.per_slot[run.slot]._step(x[i:j], a[i:j], b[i:j], run.position, None if z is None else z[i:j],
                                          out[i:j])

    def _step(self, x: np.ndarray, a: np.ndarray, b: np.ndarray, past: int, z: np.ndarray | None,
              out: np.ndarray) -> None:
        """One sequence's step: rows x / a / b / z (and out) at positions past .. past + T - 1."""
        t = x.shape[0]
        if past < 0 or past > self.pos:
            raise HeteroError(f"{self.node.label()}: past_len {past} is outside the {self.pos} positions consumed")
        if self.max_context and past + t > self.max_context:
            raise HeteroError(f"{self.node.label()}: {past} cached + {t} new tokens exceed the context of "
                              f"{self.max_context} tokens", hint="load the model with a larger context")
        if x.shape[1] != self.channels:
            raise HeteroError(f"{self.node.label()}: qkv has {x.shape[1]} channels, expected {self.channels}")
        self._rollback(past)
        if t > 1 and past > 0:  # a block (a verify step) may be cut short: keep the state at its start
            np.copyto(self.block_state, self.state)
            self.block_pos = past
        end = past + t
        self._grow(end)
        k = self.kernel - 1
        self.hist_x[past + k:end + k] = x
        self.hist_a[past:end] = a
        self.hist_b[past:end] = b
        z = None if z is None else _c32(z)
        # mode is read per call: hetero bench switches a loaded model between the forms to compare them
        mode = str(self.node.attrs.get("mode", "auto"))
        if mode not in GATED_DELTA_MODES:
            raise HeteroError(f"{self.node.label()}: mode {mode!r} is not one of {', '.join(GATED_DELTA_MODES)}")
        chunked = mode == "chunked" or (mode == "auto" and t >= self.chunked_min)
        self._advance(past, end, out, z, chunked)
        if t > 1:
            self._snapshot()


KERNELS = {("hetero", "GatedDeltaRule"): CpuGatedDeltaRule}
