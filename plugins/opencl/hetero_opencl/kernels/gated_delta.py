"""``GatedDeltaRule`` (hetero.ops.gated_delta) on OpenCL (cl/gated_delta.cl): the causal conv, q/k normalisation,
the gated delta-rule recurrence and the gated norm, with all of the node's state in device buffers.

Device state, per node: the recurrent state (float32 ``[Hv, Dk, Dv]``), the input history (pre-conv rows with
K - 1 leading zero rows, raw a / b rows; grown by doubling with device-to-device copies) and the snapshots (device
copies of the state). The host keeps only positions and the snapshot table. The rollback policy is the op's:
snapshots every ``snapshot_interval`` positions and after every call of more than one token (at most
``max_snapshots``, oldest dropped first); rolling back replays the history from the newest snapshot at or before
the target, on the device.

Prompts run the per-token recurrence too (one launch covers every new token: work-items own one value column of
one head's state and walk the tokens), whatever ``mode`` says: both forms are exact forms of the same recurrence,
so results agree with the chunked reference up to rounding. A chunked WY/UT kernel is future work (it is what would
make long prefills fast on a real GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hetero.contract import SUPPORTED, HeteroError, NodeInfo, Support, Tensor, unsupported
from hetero.contract.opforms import GATED_DELTA_MODES, gated_delta_restore_point, one_sequence

from .common import ClKernel, float32_only

PROGRAM = "gated_delta.cl"
MAX_DK = 256  # each recurrence work-item keeps a state column of Dk floats in private memory
INITIAL_ROWS = 64


class ClGatedDeltaRule(ClKernel):
    @staticmethod
    def accepts(node: NodeInfo) -> Support:
        verdict = one_sequence(node) and float32_only(node, [i for i in (0, 1, 2, 3, 5, 6, 7, 8, 9)
                                                             if i < len(node.inputs)])
        if not verdict:
            return verdict
        a = node.node.attrs
        dk = int(a.get("k_dim", 0))
        if not 0 < dk <= MAX_DK:
            return unsupported(f"GatedDeltaRule with k_dim {dk} (opencl kernels take 1..{MAX_DK})")
        if str(a.get("mode", "auto")) not in GATED_DELTA_MODES:
            return unsupported(f"GatedDeltaRule mode {a.get('mode')!r}")
        w = node.inputs[1]
        if w is None or (w.shape is not None and len(w.shape) not in (2, 3)):
            return unsupported("GatedDeltaRule conv_weight must be [C, K] or [C, 1, K]")
        return SUPPORTED

    def __init__(self, node: NodeInfo, backend) -> None:
        super().__init__(node, backend)
        a = self.node.attrs
        self.hk, self.hv = int(a["k_heads"]), int(a["v_heads"])
        self.dk, self.dv = int(a["k_dim"]), int(a["v_dim"])
        self.channels = 2 * self.hk * self.dk + self.hv * self.dv
        self.scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(self.dk)
        self.l2norm = int(bool(int(a.get("qk_l2norm", 1))))
        self.l2_eps = float(a.get("l2norm_eps", 1e-6))
        self.norm_eps = float(a.get("norm_eps", 1e-6))
        self.silu = int(str(a.get("conv_activation", "silu")) == "silu")
        self.interval = int(a.get("snapshot_interval", 256))
        self.max_snapshots = max(int(a.get("max_snapshots", 8)), 1)
        self.max_context = int(a.get("max_context", 0))
        self.defines = (f"GDN_DK={self.dk}",)
        self.state_bytes = self.hv * self.dk * self.dv * 4
        self.state = None  # device buffers, allocated at the first run (the conv kernel size comes with the weight)
        self.hist_x = self.hist_a = self.hist_b = None
        self.rows = 0  # history capacity in positions
        self.kernel_size = 0
        self.pos = 0
        self.snaps: dict[int, object] = {}
        self.block_pos = -1  # the block-start checkpoint (the op's doc): position (-1: none) and device state
        self.block_state: object | None = None
        self.weights: dict[str, object] = {}

    # -- state ----------------------------------------------------------------------------------------------------
    def _init(self, kernel_size: int) -> None:
        self.kernel_size = kernel_size
        self.state = self.be.alloc(self.state_bytes, "weights")
        self.ctx.zero(self.state, 0, self.state_bytes)
        self.rows = 0
        self._grow(INITIAL_ROWS)

    def _grow(self, end: int) -> None:
        if end <= self.rows:
            return
        rows = max(end, 2 * self.rows, INITIAL_ROWS)
        lead = self.kernel_size - 1
        for name, width, extra in (("hist_x", self.channels, lead), ("hist_a", self.hv, 0), ("hist_b", self.hv, 0)):
            nbytes = (rows + extra) * width * 4
            new = self.be.alloc(nbytes, "weights")
            old = getattr(self, name)
            used = 0 if old is None else (self.rows + extra) * width * 4
            if used:
                self.ctx.copy(old, new, 0, 0, used)
            self.ctx.zero(new, used, nbytes - used)
            setattr(self, name, new)
        self.rows = rows

    def _snapshot(self) -> None:
        snap = self.snaps.pop(self.pos, None) or self.be.alloc(self.state_bytes, "weights")
        self.ctx.copy(self.state, snap, 0, 0, self.state_bytes)
        self.snaps[self.pos] = snap
        while len(self.snaps) > self.max_snapshots:
            del self.snaps[next(iter(self.snaps))]

    def _advance(self, start: int, end: int, out, z, norm_w) -> None:
        """Positions [start, end) from the state at ``start``; output rows to ``out`` (a device buffer) or none."""
        t = end - start
        if t <= 0:
            return
        c = self.channels
        conv = self.be.scratch("gdn_conv", t * c * 4)
        w, bias = self.weights["conv_w"], self.weights.get("conv_b")
        self.launch(self.k(PROGRAM, "gdn_conv", self.defines), [c, t], None, self.hist_x, w,
                    bias if bias is not None else self.be.dummy, conv, c, self.kernel_size, start,
                    int(bias is not None), self.silu)
        self.launch(self.k(PROGRAM, "gdn_qk", self.defines), [2 * self.hk, t], None, conv, c, self.hk, self.l2norm,
                    self.l2_eps, self.scale)
        a_log, dt_bias = self.weights.get("a_log"), self.weights.get("dt_bias")
        gating = int(a_log is not None)
        recurrent = self.k(PROGRAM, "gdn_recurrent", self.defines)
        pos = start
        while pos < end:
            stop = end
            if self.interval > 0:
                stop = min(end, (pos // self.interval + 1) * self.interval)
            self.launch(recurrent, [self.dv, self.hv], None, conv, self.hist_a, self.hist_b,
                        a_log if gating else self.be.dummy, dt_bias if gating else self.be.dummy, self.state,
                        out if out is not None else self.be.dummy, c, self.hk, self.hv, self.dv, start,
                        pos - start, stop - start, gating, int(out is not None))
            self.pos = pos = stop
            if self.interval > 0 and stop % self.interval == 0:
                self._snapshot()
        if out is not None and z is not None:
            self.launch(self.k(PROGRAM, "gdn_gated_norm", self.defines), [self.hv, t], None, out, z, norm_w, self.hv,
                        self.dv, self.norm_eps)

    def _rollback(self, target: int) -> None:
        if target == self.pos:
            return
        self.block_pos, base = gated_delta_restore_point(self.snaps, self.block_pos, target)
        if base in self.snaps:
            self.ctx.copy(self.snaps[base], self.state, 0, 0, self.state_bytes)
        elif base > 0:  # the block-start checkpoint
            self.ctx.copy(self.block_state, self.state, 0, 0, self.state_bytes)
        else:
            self.ctx.zero(self.state, 0, self.state_bytes)
        self.pos = base
        self._advance(base, target, None, None, None)

    # -- run ------------------------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> None:
        x, w, y = inputs[0], inputs[1], outputs[0]
        assert x is not None and w is not None
        t = x.shape[0]
        past = int(np.asarray(self.host(inputs[4])).reshape(-1)[0])
        if x.shape[1] != self.channels:
            raise HeteroError(f"{self.node.label()}: qkv has {x.shape[1]} channels, expected {self.channels}")
        if w.shape[0] != self.channels:
            raise HeteroError(f"{self.node.label()}: conv_weight has {w.shape[0]} channels, expected {self.channels}")
        if self.state is None:
            self._init(int(w.shape[-1]))
        elif int(w.shape[-1]) != self.kernel_size:
            raise HeteroError(f"{self.node.label()}: conv_weight kernel changed from {self.kernel_size} to "
                              f"{w.shape[-1]}")
        if past < 0 or past > self.pos:
            raise HeteroError(f"{self.node.label()}: past_len {past} is outside the {self.pos} positions consumed")
        if self.max_context and past + t > self.max_context:
            raise HeteroError(f"{self.node.label()}: {past} cached + {t} new tokens exceed the context of "
                              f"{self.max_context} tokens", hint="load the model with a larger context")
        opt = (lambda i: inputs[i].buffer if len(inputs) > i and inputs[i] is not None else None)  # noqa: E731
        self.weights = {"conv_w": w.buffer}
        for name, index in (("conv_b", 5), ("a_log", 6), ("dt_bias", 7)):
            buf = opt(index)
            if buf is not None:
                self.weights[name] = buf
        self._rollback(past)
        if t == 0:
            return
        if t > 1 and past > 0:  # a block (a verify step) may be cut short: keep the state at its start
            if self.block_state is None:
                self.block_state = self.be.alloc(self.state_bytes, "weights")
            self.ctx.copy(self.state, self.block_state, 0, 0, self.state_bytes)
            self.block_pos = past
        end = past + t
        self._grow(end)
        c, lead = self.channels, self.kernel_size - 1
        self.ctx.copy(x.buffer, self.hist_x, 0, (past + lead) * c * 4, t * c * 4)
        decay, beta = inputs[2], inputs[3]
        assert decay is not None and beta is not None
        self.ctx.copy(decay.buffer, self.hist_a, 0, past * self.hv * 4, t * self.hv * 4)
        self.ctx.copy(beta.buffer, self.hist_b, 0, past * self.hv * 4, t * self.hv * 4)
        self._advance(past, end, y.buffer, opt(8), opt(9))
        if t > 1:
            self._snapshot()


KERNELS = {("hetero", "GatedDeltaRule"): ClGatedDeltaRule}
