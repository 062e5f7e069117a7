"""The progress bar the model builders draw (kept at this path for them): see ``hetero.progress``."""

from __future__ import annotations

from ..progress import Progress, phase

__all__ = ["Progress", "phase"]
