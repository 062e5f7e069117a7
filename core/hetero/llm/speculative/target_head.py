"""The target model's token embedding and LM head, run for a drafter through hetero's own kernels.

Eagle-3 reads the target's embedding table; DFlash reads it and shares the target's LM head. Neither keeps a
second copy: two small Sessions are built over the *same* weight arrays the target's graph holds (quantized or
float, exactly as the target runs them), so the drafter's logits are the target's head applied to the drafter's
hidden rows, at the cost of one [T, hidden] x [hidden, vocab] product.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...contract import dtypes
from ...contract.errors import HeteroError
from ...contract.graph import HETERO_DOMAIN, Graph, Node
from ...contract.tensor import TensorInfo
from ...runtime.session import Session
from ..families.decoder import LOGITS
from .target import Target

_IDS, _HIDDEN, _OUT = "ids", "hidden", "out"


class TargetHead:
    """``embed(ids)`` -> ``[T, hidden]`` and ``logits(hidden)`` -> ``[T, vocab]`` with the target's weights."""

    def __init__(self, llm: Target) -> None:
        session = getattr(llm, "session", None)  # an Llm's; the Target protocol leaves it out
        if not isinstance(session, Session):
            raise HeteroError(f"model {llm.name!r}: a drafter sharing its embedding and LM head needs its graph "
                              "in a Session (a hetero.llm.Llm)")
        graph = session.graph
        producers = graph.producers()
        embed = next((n for n in graph.nodes if n.op_type == "Embedding"), None)
        head = producers.get(LOGITS)
        if embed is None or head is None or head.op_type != "QMatMul":
            raise HeteroError(f"model {llm.name!r}: its graph has no Embedding node or no QMatMul LM head "
                              f"producing {LOGITS!r}; a drafter needs both")
        self.hidden_size = llm.config.hidden_size
        self.vocab_size = llm.config.vocab_size
        backends = session.placement.counts()
        self._embed = Session(_one_node(graph, embed, _IDS, TensorInfo(dtypes.int64, (None,))),
                              backends=list(backends), on_fallback="silent", threads=llm.threads)
        self._head = Session(_one_node(graph, head, _HIDDEN, TensorInfo(dtypes.float32, (None, self.hidden_size))),
                             backends=list(backends), on_fallback="silent", threads=llm.threads)

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        out = self._embed.run({_IDS: np.asarray(ids, dtype=np.int64)}, [_OUT])[_OUT]
        return np.asarray(out, dtype=np.float32).reshape(-1, self.hidden_size)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(hidden, dtype=np.float32).reshape(-1, self.hidden_size)
        return np.asarray(self._head.run({_HIDDEN: rows}, [_OUT])[_OUT], dtype=np.float32)

    def close(self) -> None:
        self._embed.close()
        self._head.close()


def _one_node(graph: Graph, node: Node, input_name: str, info: TensorInfo) -> Graph:
    """A graph of ``node`` alone: its first input fed by ``input_name``, its weights the target's own arrays."""
    weights = {name: graph.initializers[name] for name in node.inputs[1:] if name in graph.initializers}
    copy = Node(node.op_type, [input_name, *node.inputs[1:]], [_OUT], dict(node.attrs), name=node.name,
                domain=node.domain)
    one = Graph(nodes=[copy], inputs=[input_name], outputs=[_OUT], initializers=weights,
                opsets={"": 21, HETERO_DOMAIN: 1}, name=f"target_{node.op_type.lower()}")
    one.values[input_name] = info
    return one
