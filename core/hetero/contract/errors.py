"""The error hierarchy: every failure hetero reports on purpose is a ``HeteroError``.

Each kind names what went wrong and, where it helps, what the user can do (``hint``). Messages name the file, the
field, the node or the op concerned so that a user never has to read a traceback to find the culprit.
"""

from __future__ import annotations


class HeteroError(Exception):
    """Base class of every error hetero raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class ModelFormatError(HeteroError):
    """A model file (ONNX, GGUF, safetensors, config) is malformed or inconsistent."""


class ShapeError(HeteroError):
    """Shapes or dtypes that an op cannot accept."""


class UnsupportedOp(HeteroError):
    """No backend (not even the numpy reference) implements an op, or an attribute value of it."""


class BackendUnavailable(HeteroError):
    """A backend's hardware, driver or library is missing; raised by ``Factory.probe``."""


class BackendError(HeteroError):
    """A backend failed while preparing or running work."""


class PluginError(HeteroError):
    """A plugin could not be loaded, or is incompatible with this version of hetero."""


class FallbackError(HeteroError):
    """Nodes left the preferred backends while the session asked for ``on_fallback="error"``."""


class InputError(HeteroError):
    """Inputs given to ``Session.run`` do not match the model (names, dtypes, ranks)."""


class HeteroWarning(UserWarning):
    """Warnings hetero emits (fallback summaries, skipped backends)."""
