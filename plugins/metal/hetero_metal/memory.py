"""Memory the GPU reads and writes in place: whole pages of their own (anonymous mappings), which the Metal host
module wraps as shared-storage buffers without a copy (``newBufferWithBytesNoCopy`` takes page-aligned memory of
whole pages). The backend's arenas and tensors and the kernels' caches, state and scratch live here; other host
arrays are staged by the host module."""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

PAGE = mmap.PAGESIZE


def page_aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` zeroed bytes at the start of whole pages of their own."""
    size = max(-(-int(nbytes) // PAGE), 1) * PAGE
    return np.frombuffer(mmap.mmap(-1, size), np.uint8)[:nbytes]


def device_array(shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
    """A zeroed array in page-aligned memory of its own."""
    dims = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
    dt = np.dtype(dtype)
    return page_aligned(int(np.prod(dims, dtype=np.int64)) * dt.itemsize).view(dt).reshape(dims)
