"""Tensors: a shape, an element type, and a buffer that lives in one backend's memory.

Host tensors (memory domain ``"host"``) wrap a numpy array, so numpy and DLPack interop are free. Device tensors
wrap whatever handle their backend's ``alloc`` returned; ``numpy()`` downloads them through that backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from . import dtypes
from .dtypes import DType

Dim = int | None  # None: not known before run time
Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class TensorInfo:
    """What shape inference knows of a value: its dtype and its shape (``shape=None``: even the rank is unknown)."""

    dtype: DType
    shape: Shape | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


class Owner(Protocol):
    """What a tensor needs of the backend that owns it (a ``hetero.contract.Backend``); named here so that tensor
    info stays a leaf module."""

    @property
    def name(self) -> str: ...
    @property
    def memory_domain(self) -> str: ...

    def download(self, tensor: Tensor) -> np.ndarray: ...


def static_shape(info: TensorInfo | None) -> tuple[int, ...]:
    """The dims of a value whose shape is fully known, as every ``prepare`` receives them (a ValueError otherwise)."""
    if info is None or info.shape is None or any(d is None for d in info.shape):
        raise ValueError(f"{info} has no static shape")
    return tuple(d for d in info.shape if d is not None)


class Tensor:
    """A buffer with a shape and dtype, owned by a backend (``backend=None``: plain host memory).

    ``host_copy``: for a small device tensor that carries shapes or indices (an uploaded ``past_len``, a ``Shape``
    output, integer shape arithmetic), the backend that produced it may keep its values on the host here. The runtime
    reads value inputs (Reshape's shape, Slice's starts...) through ``host_values()``, which uses this copy and never
    waits for the device; a kernel that writes the tensor on the device leaves it None (the executor clears it on
    reused outputs before each interpreted run).
    """

    __slots__ = ("backend", "buffer", "dtype", "host_copy", "shape")

    def __init__(self, buffer: Any, shape: Sequence[int], dtype: DType, backend: Owner | None = None) -> None:
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.backend = backend
        self.host_copy: np.ndarray | None = None

    @classmethod
    def of_layout(cls, buffer: Any, shape: tuple[int, ...], dtype: DType, backend: Owner | None = None) -> Tensor:
        """The constructor for a ``shape`` already a tuple of ints (another tensor's): none converted (hot paths)."""
        tensor = cls.__new__(cls)
        tensor.buffer, tensor.shape, tensor.dtype, tensor.backend = buffer, shape, dtype, backend
        tensor.host_copy = None
        return tensor

    @classmethod
    def from_numpy(cls, array: np.ndarray | Any) -> Tensor:
        array = np.asarray(array)
        return cls(array, array.shape, dtypes.from_numpy(array.dtype))

    @classmethod
    def from_dlpack(cls, obj: Any) -> Tensor:
        """Wrap any DLPack producer (torch, jax, cupy on host...) without copying."""
        return cls.from_numpy(np.from_dlpack(obj))

    @property
    def is_host(self) -> bool:
        return self.backend is None or self.backend.memory_domain == "host"

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.dtype, self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        """The values as a numpy array: a view for host tensors, a download for device ones."""
        if self.is_host:
            return self.buffer
        assert self.backend is not None
        return self.backend.download(self)

    def host_values(self) -> np.ndarray:
        """The values on the host for reading shapes and indices: the buffer of a host tensor, the producer's
        ``host_copy`` of a device one, else a download (which waits for the device)."""
        if self.is_host:
            return self.buffer
        if self.host_copy is not None:
            return self.host_copy
        return self.numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.numpy().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.numpy().__dlpack_device__()

    def __repr__(self) -> str:
        where = "host" if self.backend is None else self.backend.name
        return f"Tensor({self.dtype}{list(self.shape)}, {where})"
