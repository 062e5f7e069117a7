"""``GatedDeltaRule`` (hetero.ops.gated_delta) on Metal (msl/gated_delta.metal): the causal conv, the q/k
normalisation, the gating, the gated delta rule over the step's tokens and the gated norm are Metal dispatches.

The node's state lives in the backend's (unified) memory: the recurrent state (float32 ``[Hv, Dk, Dv]``), the
input history (pre-conv rows with K - 1 leading zero rows, so the conv window of any range is a slice; g and beta
after gating) and the snapshots. The rollback policy is the op's (snapshots every ``snapshot_interval`` positions
and after every call of more than one token, at most ``max_snapshots``; the block-start checkpoint of a verify
step; rolling back recomputes from the newest one at or before the target). A prompt runs its tokens through the
recurrence kernel in one dispatch per snapshot interval, whatever ``mode`` says (the recurrence and the chunked
form are exact forms of the same computation); a decode step is one token of it. Planned at each run: the
positions and the snapshots are host bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, HeteroError, NodeInfo, Support, Tensor, unsupported
from hetero.contract.opforms import GatedDeltaAttrs, gated_delta_refusal, gated_delta_restore_point

from ..memory import device_array
from ..plan import dispatch, groups_for
from .common import MetalKernel, float32_only, placeholder

MAX_KDIM = 256  # GDR_MAX_KDIM: q and k of a token staged in threadgroup memory
MAX_VDIM = 1024  # one thread per value column
INITIAL_ROWS = 64


def _given(array: np.ndarray | None) -> np.ndarray:
    return placeholder() if array is None else array


def _flat(array: np.ndarray, offset: int = 0) -> np.ndarray:
    """A contiguous 1-D view from element ``offset`` on (a kernel reads rows from there by its own strides)."""
    return array.reshape(-1)[offset:]


class MetalGatedDeltaRule(MetalKernel):
    bindable = False

    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = float32_only(node, [i for i in (0, 1, 2, 3, 5, 6, 7, 8, 9) if i < len(node.inputs)])
        if not verdict:
            return verdict
        dk, dv = int(node.attr("k_dim", 0)), int(node.attr("v_dim", 0))
        if not (0 < dk <= MAX_KDIM and 0 < dv <= MAX_VDIM):
            return unsupported(f"GatedDeltaRule with k_dim {dk}, v_dim {dv} (metal takes k_dim <= {MAX_KDIM}, "
                               f"v_dim <= {MAX_VDIM})")
        w = node.inputs[1]
        refusal = gated_delta_refusal(node.node.attrs, None if w is None or w.shape is None else len(w.shape))
        if w is None or refusal:
            return unsupported(refusal or "GatedDeltaRule without a conv_weight")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        self.attrs = attrs = GatedDeltaAttrs.of(self.node.attrs)
        self.hk, self.hv, self.dk, self.dv = attrs.k_heads, attrs.v_heads, attrs.k_dim, attrs.v_dim
        self.channels, self.interval = attrs.channels, attrs.snapshot_interval
        self.state = device_array((self.hv, self.dk, self.dv), np.float32)
        self.taps = 0  # the conv kernel size, known at the first run
        self.hist_x = np.zeros((0, self.channels), np.float32)
        self.hist_g = np.zeros((0, self.hv), np.float32)
        self.hist_beta = np.zeros((0, self.hv), np.float32)
        self.pos = 0
        self.snaps: dict[int, np.ndarray] = {}
        self.block_pos = -1  # the block-start checkpoint: position (-1: none) and state
        self.block_state = np.zeros_like(self.state)
        self.conv_w = np.zeros((self.channels, 1), np.float32)
        self.weights: dict[str, np.ndarray | None] = {}

    # -- state ----------------------------------------------------------------------------------------------------
    def _grow(self, end: int) -> None:
        cap = self.hist_g.shape[0]
        if end <= cap:
            return
        cap = max(end, 2 * cap, INITIAL_ROWS)
        self.backend.synchronize()  # queued work may read the old history
        for name, rows in (("hist_x", cap + self.taps - 1), ("hist_g", cap), ("hist_beta", cap)):
            old = getattr(self, name)
            new = device_array((rows, old.shape[1]), np.float32)
            new[:old.shape[0]] = old
            setattr(self, name, new)

    def _snapshot(self) -> None:
        self.backend.synchronize()  # the state the queued dispatches write
        self.snaps[self.pos] = self.state.copy()
        while len(self.snaps) > self.attrs.max_snapshots:
            del self.snaps[next(iter(self.snaps))]

    def _advance(self, start: int, end: int, out: np.ndarray | None, z: np.ndarray | None) -> None:
        """Positions [start, end) from the state at ``start`` (history recorded); rows of ``out`` or none."""
        t = end - start
        if t <= 0:
            return
        c, w = self.channels, self.weights
        conv = self.backend.scratch("gdn_conv", t * c, np.float32).reshape(t, c)
        steps = [dispatch("gdn_conv", {
            "window": _flat(self.hist_x[start:end + self.taps - 1]), "w": self.conv_w,
            "bias": _given(w["conv_b"]), "out": conv,
            "p": {"t": t, "channels": c, "taps": self.taps, "has_bias": int(w["conv_b"] is not None),
                  "silu": int(self.attrs.silu)}}, (groups_for(c, 64), t), (64, 1))]
        if self.attrs.qk_l2norm:
            steps.append(dispatch("gdn_l2norm", {"x": conv, "p": {
                "heads": 2 * self.hk, "dim": self.dk, "row": c, "has_gate": 0, "eps": self.attrs.l2norm_eps}},
                (2 * self.hk, t), (32, 1)))
        result = out if out is not None else self.backend.scratch("gdn_out", t * self.hv * self.dv, np.float32)
        threads = max(32, -(-self.dv // 32) * 32)
        pos = start
        while pos < end:
            stop = end if self.interval <= 0 else min(end, (pos // self.interval + 1) * self.interval)
            i, j = pos - start, stop - start
            steps.append(dispatch("gated_delta_chunk", {
                "q": _flat(conv, i * c), "k": _flat(conv, i * c + self.hk * self.dk),
                "v": _flat(conv, i * c + 2 * self.hk * self.dk), "g": _flat(self.hist_g[pos:stop]),
                "beta": _flat(self.hist_beta[pos:stop]), "state": self.state,
                "out": _flat(result, i * self.hv * self.dv),
                "p": {"t": j - i, "k_heads": self.hk, "v_heads": self.hv, "k_dim": self.dk, "v_dim": self.dv,
                      "qk_row": c, "v_row": c, "scale": self.attrs.scale}}, (self.hv,), (threads,)))
            self.backend.submit(steps)
            steps = []
            self.pos = pos = stop
            if self.interval > 0 and stop % self.interval == 0:
                self._snapshot()
        if out is not None and w["norm_w"] is not None:
            self.backend.submit([dispatch("gdn_gated_norm", {
                "o": out, "z": _given(z), "weight": w["norm_w"], "p": {
                    "heads": self.hv, "dim": self.dv, "row": self.hv * self.dv, "has_gate": int(z is not None),
                    "eps": self.attrs.norm_eps}}, (self.hv, t), (32, 1))])

    def _rollback(self, target: int) -> None:
        if target == self.pos:
            return
        self.block_pos, base = gated_delta_restore_point(self.snaps, self.block_pos, target)
        self.backend.synchronize()
        saved = self.snaps.get(base, self.block_state if base == self.block_pos else None)
        if saved is None:
            self.state.fill(0.0)
        else:
            np.copyto(self.state, saved)
        self.pos = base
        self._advance(base, target, None, None)

    # -- run ------------------------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        self.backend.synchronize()  # past_len and the inputs are read and copied on the host
        arrays = [None if t is None else np.ascontiguousarray(t.numpy(), dtype=np.float32) if i != 4 else t.numpy()
                  for i, t in enumerate(inputs)]
        x, w, out = arrays[0], arrays[1], outputs[0].numpy()
        assert x is not None and w is not None
        t = x.shape[0]
        past = int(np.asarray(arrays[4]).reshape(-1)[0])
        label = self.node.label()
        if x.shape[1] != self.channels or w.shape[0] != self.channels:
            raise HeteroError(f"{label}: qkv has {x.shape[1]} channels and conv_weight {w.shape[0]}, expected "
                              f"{self.channels}")
        if self.taps == 0:
            self.taps = int(w.shape[-1])
        elif int(w.shape[-1]) != self.taps:
            raise HeteroError(f"{label}: conv_weight kernel changed from {self.taps} to {w.shape[-1]}")
        if past < 0 or past > self.pos:
            raise HeteroError(f"{label}: past_len {past} is outside the {self.pos} positions consumed")
        if self.attrs.max_context and past + t > self.attrs.max_context:
            raise HeteroError(f"{label}: {past} cached + {t} new tokens exceed the context of {self.attrs.max_context} "
                              "tokens", hint="load the model with a larger context")
        opt = (lambda i: arrays[i].reshape(-1) if len(arrays) > i and arrays[i] is not None else None)  # noqa: E731
        self.conv_w = w.reshape(self.channels, self.taps)
        self.weights = {"conv_b": opt(5), "a_log": opt(6), "dt_bias": opt(7), "norm_w": opt(9)}
        self._rollback(past)
        if t == 0:
            return
        if t > 1 and past > 0:  # a block (a verify step) may be cut short: keep the state at its start
            self.backend.synchronize()
            np.copyto(self.block_state, self.state)
            self.block_pos = past
        end = past + t
        self._grow(end)
        self.hist_x[past + self.taps - 1:end + self.taps - 1] = x
        gating = self.weights["a_log"] is not None
        a, b = arrays[2], arrays[3]
        assert a is not None and b is not None  # required inputs
        self.backend.submit([dispatch("gdn_gates", {
            "a": a, "b": b, "a_log": _given(self.weights["a_log"]), "dt_bias": _given(self.weights["dt_bias"]),
            "g": _flat(self.hist_g[past:end]), "beta": _flat(self.hist_beta[past:end]),
            "p": {"n": t * self.hv, "heads": self.hv, "gating": int(gating)}}, (groups_for(t * self.hv, 64),), (64,))])
        dense = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
        self._advance(past, end, dense, opt(8))
        if dense is not out:
            self.backend.synchronize()
            np.copyto(out, dense)
        if t > 1:
            self._snapshot()


KERNELS = {("hetero", "GatedDeltaRule"): MetalGatedDeltaRule}
