"""Op schemas (shape inference + numpy reference). Importing this package registers every built-in op."""

from . import elementwise, linalg  # noqa: F401  (registration side effects)
from .registry import OpContext, OpSchema, all_schemas, find, get, op, register

__all__ = ["OpContext", "OpSchema", "all_schemas", "find", "get", "op", "register"]
