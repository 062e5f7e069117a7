"""Op schemas (shape inference + numpy reference). Importing this package registers every built-in op."""

from . import attention, control, creation, elementwise, linalg, loss, nn, quant, reduce, resize, rnn, shape  # noqa: F401  (registration side effects)
from . import fused  # noqa: F401  (ops that graph passes create)
from .registry import OpContext, OpSchema, all_schemas, find, get, op, register

__all__ = ["OpContext", "OpSchema", "all_schemas", "find", "get", "op", "register"]
