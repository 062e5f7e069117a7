"""A model-based drafter's linears through the target's backends: each ``drafter_nn.Linear`` becomes a one-node
QMatMul Session over its weight block-quantized (q8, symmetric, blocks of 32 by default), run by the same kernels as
the target's own matmuls, on the target's backends and threads.

Why: at a real target's width a drafter is large (Qwen2.5-1.5B's: an Eagle-3 head with a 3072-wide MLP and an 8192
draft vocabulary is 168 MB of float32, a DFlash layer with the target's 8960-wide MLP 190 MB), and float32 numpy
re-reads all of it for each draft: a DFlash draft took about as long as a target decode step, an Eagle-3 draft of 4
tokens two thirds of one (docs/speculative-drafters.md). q8 reads a quarter of the bytes and the quantized kernels
take a few rows at the cost of about one. The drafts may differ from float32 ones (int8 activations and weights);
what the target accepts does not depend on how a draft was made, so greedy output stays exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ...contract import dtypes, quant
from ...contract.errors import HeteroError
from ...contract.graph import HETERO_DOMAIN, Graph, Node
from ...contract.tensor import TensorInfo
from ...runtime.session import Session
from .drafter_nn import Linear
from .target import Target

_X, _W, _OUT = "x", "w", "out"
WTYPES = ("q8", "q4", "f16", "f32")


def _weight(dense: np.ndarray, wtype: str) -> tuple[np.ndarray, dict[str, object]]:
    """``[out, in]`` float32 -> the QMatMul weight and its attributes."""
    if wtype == "f32":
        return dense, {"wtype": "f32"}
    if wtype == "f16":
        return dense.astype(np.float16), {"wtype": "f16"}
    fmt = quant.parse_quant(wtype)
    assert fmt is not None
    return quant.quantize(dense, fmt), fmt.attrs()


def _session(linear: Linear, name: str, wtype: str, backends: Sequence[str], threads: int | None) -> Session:
    weight, attrs = _weight(linear.dense(), wtype)
    node = Node("QMatMul", [_X, _W], [_OUT], attrs, name=name, domain=HETERO_DOMAIN)
    graph = Graph(nodes=[node], inputs=[_X], outputs=[_OUT], initializers={_W: weight},
                  opsets={"": 21, HETERO_DOMAIN: 1}, name=f"drafter_{name}")
    graph.values[_X] = TensorInfo(dtypes.float32, (None, linear.shape[0]))
    return Session(graph, backends=list(backends), on_fallback="silent", threads=threads)


def compile_linears(linears: Iterable[Linear], *, backends: Sequence[str], threads: int | None,
                    wtype: str = "q8") -> list[Session]:
    """Point every linear's ``run`` at its own Session (weights in ``wtype``: q8 / q4 / f16 / f32) and release its
    float32 copy. Returns the Sessions (the caller closes them)."""
    if wtype not in WTYPES:
        raise HeteroError(f"drafter linears: wtype {wtype!r} is not one of {', '.join(WTYPES)}")
    sessions = []
    for i, linear in enumerate(linears):
        if linear.run is not None:
            continue
        session = _session(linear, f"linear{i}", wtype, backends, threads)
        sessions.append(session)
        linear.run = lambda rows, s=session: s.run({_X: rows}, [_OUT])[_OUT]
        linear.weight = None
    return sessions


def compile_for_target(linears: Iterable[Linear], llm: Target, wtype: str | None) -> list[Session]:
    """``compile_linears`` on the backends and threads the target runs with; ``wtype`` None keeps numpy."""
    if wtype is None:
        return []
    session = getattr(llm, "session", None)
    if not isinstance(session, Session):
        raise HeteroError(f"model {llm.name!r}: running a drafter's linears natively needs the target's Session "
                          "(a hetero.llm.Llm); pass linears=None for numpy")
    return compile_linears(linears, backends=list(session.placement.counts()), threads=llm.threads, wtype=wtype)
