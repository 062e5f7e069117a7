"""Op schemas (shape inference + numpy reference). Importing this package registers every built-in op."""

from ..contract.registry import OpContext, OpSchema, all_schemas, find, get, op, register
from . import (  # noqa: F401  (registration side effects)
    attention,
    contrib,
    control,
    creation,
    detection,
    elementwise,
    fused,
    gated_delta,
    linalg,
    linear_attention,
    llm,
    loss,
    ml,
    ml_linear,
    nn,
    quant,
    reduce,
    resize,
    rnn,
    shape,
    signal,
    spatial,
    strings,
)

__all__ = ["OpContext", "OpSchema", "all_schemas", "find", "get", "op", "register"]
