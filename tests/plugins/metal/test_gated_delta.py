"""GatedDeltaRule on metal through the emulator: the op's conv, normalisation, gating, recurrence and gated norm
as Metal kernels, against the reference op across prompts, decode steps, snapshots and rollbacks (the graphs and
data of the OpenCL test), and explain() placing it on metal."""

from __future__ import annotations

import numpy as np
import pytest
from opencl.test_qwen3_5 import delta_data, delta_graph, rows  # the same graphs as the OpenCL test

import hetero

from .conftest import needs_emulator
from .test_backend import emulated  # noqa: F401  # the fixture

pytestmark = needs_emulator


@pytest.mark.parametrize("gating,bias,norm", [(True, False, True), (False, True, False)])
def test_gated_delta_rule_matches_reference_across_calls_and_rollback(emulated, gating, bias, norm):  # noqa: F811
    consts, feeds = delta_data(140, 3, gating, bias)
    attrs = {"snapshot_interval": 32, "max_snapshots": 3, "max_context": 256}
    ours = hetero.Session(delta_graph(consts, attrs, norm), backends=["metal"], on_fallback="error")
    ref = hetero.Session(delta_graph(consts, attrs, norm), backends=["reference"])
    assert {p.backend for p in ours.placement.nodes} == {"metal"}
    assert "GatedDeltaRule metal" in " ".join(ours.explain().split())
    # a prompt crossing snapshot boundaries, decode steps (the third one replayed), a second prompt, then
    # rollbacks (between snapshots, behind the oldest kept one, to 0) and more tokens
    calls = [(0, 70, 0), (70, 71, 70), (71, 72, 71), (72, 73, 72), (73, 130, 73), (100, 110, 40), (110, 111, 50),
             (40, 45, 45), (0, 7, 0), (7, 8, 7)]
    for lo, hi, past in calls:
        step = rows(feeds, lo, hi, past, norm)
        np.testing.assert_allclose(ours.run(step)["y"], ref.run(step)["y"], rtol=1e-4, atol=2e-5,
                                   err_msg=f"rows {lo}:{hi} at {past}")


def test_gated_delta_rule_refuses_bad_positions(emulated):  # noqa: F811
    consts, feeds = delta_data(10, 1, True, False)
    session = hetero.Session(delta_graph(consts, {"max_context": 8}, True), backends=["metal"], on_fallback="error")
    with pytest.raises(hetero.HeteroError, match="outside"):
        session.run(rows(feeds, 0, 2, 3, True))
    with pytest.raises(hetero.HeteroError, match="context"):
        session.run(rows(feeds, 0, 9, 0, True))
