"""Steps of several sequences for the stateful LLM ops' references (``Attention``, ``GatedDeltaRule``).

A model serving several sequences at once (``hetero.llm.batch``) feeds its stateful ops per-row positions and a
``slots`` input (``hetero.contract.opforms``): row t is a token of sequence ``slots[t]`` at position
``positions[t]``. The node keeps one state per slot (a KV cache, a recurrent state); the step is the one-sequence
step of each run of rows (``slot_runs``) on its slot's state, in row order, so its result is by construction what
each sequence gets alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..contract import dtypes
from ..contract.opforms import POSITION_INPUT, SLOTS_INPUT, SlotRun, slot_runs
from ..contract.registry import OpContext
from .shapes import input_info


def check_positions(ctx: OpContext, index: int) -> None:
    """Input ``index`` is past_len (an int64 scalar) or per-row positions (int64 ``[T]``)."""
    info = input_info(ctx, index)
    if info.dtype != dtypes.int64 or (info.shape is not None and len(info.shape) > 1):
        raise ctx.fail(f"past_len must be an int64 scalar (or int64 [T] positions, one per row), got {info}")


def check_slots(ctx: OpContext) -> None:
    """The optional slots input is int64 ``[T]`` and the ``slots`` attribute (how many) is positive."""
    index = SLOTS_INPUT[ctx.node.op_type]
    if not ctx.has_input(index):
        return
    info = input_info(ctx, index)
    if info.dtype != dtypes.int64 or (info.shape is not None and len(info.shape) != 1):
        raise ctx.fail(f"slots must be int64 [T] (the sequence of each row), got {info}")
    if int(ctx.attr("slots", 1)) < 1:
        raise ctx.fail("the 'slots' attribute (sequences the node holds state for) must be positive")


def is_multi(ctx: OpContext) -> bool:
    """Whether this call is a step of several sequences (a slots input, or several positions: one per row)."""
    op_type = ctx.node.op_type
    if ctx.has_input(SLOTS_INPUT[op_type]):
        return True
    return np.asarray(ctx.array(POSITION_INPUT[op_type])).size > 1


def by_slot(ctx: OpContext, step: Callable[[OpContext], list[np.ndarray]], rows: Sequence[int]) -> list[np.ndarray]:
    """Run the one-sequence reference ``step`` of a stateful op for each one-sequence run of this step: inputs
    ``rows`` cut to the run's rows, past_len the run's first position, the state that of the run's slot. The
    outputs' rows are the runs' outputs, in order."""
    op_type = ctx.node.op_type
    pos_index, slot_index = POSITION_INPUT[op_type], SLOTS_INPUT[op_type]
    slots = ctx.array(slot_index) if ctx.has_input(slot_index) else None
    runs = slot_runs(ctx.node.label(), ctx.array(pos_index), slots, int(ctx.attr("slots", 1))) \
        or [SlotRun(0, 0, 0, 0)]  # no rows: an empty step of slot 0 (empty outputs of the right widths)
    state: dict[str, Any] = ctx.state if ctx.state is not None else {}
    per_slot: dict[int, dict[str, Any]] = state.setdefault("slots", {})
    infos = list(ctx.inputs)
    if slot_index < len(infos):
        infos[slot_index] = None
    parts: list[list[np.ndarray]] = []
    for run in runs:
        values: list[np.ndarray | None] = list(ctx.values)
        for i in rows:
            value = values[i] if i < len(values) else None
            if value is not None:
                values[i] = value[run.start:run.end]
        values[pos_index] = np.asarray(run.position, dtype=np.int64)
        if slot_index < len(values):
            values[slot_index] = None
        sub = OpContext(ctx.node, infos, values, ctx.opset, ctx.run_subgraph, per_slot.setdefault(run.slot, {}))
        parts.append(step(sub))
    return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]
