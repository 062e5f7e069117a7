"""The reference backend: every op's numpy reference, on the host. It ends every fallback chain.

It is registered through the same entry point group as any third-party backend (see the core's pyproject.toml),
and it is the smallest complete example of the plugin contract.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .contract.backend import API_VERSION, Backend, Device, Factory, HostMemory, NodeInfo, Support
from .contract.hookspecs import hookimpl
from .contract.reference import ReferenceKernel, reference_supports

api_version = API_VERSION  # part of the core: it is always the core's own version


class ReferenceBackend(HostMemory, Backend):
    name: ClassVar[str] = "reference"

    def supports(self, node: NodeInfo) -> Support:
        return reference_supports(node)

    def kernel(self, node: NodeInfo) -> ReferenceKernel:
        return ReferenceKernel(node, self)


class ReferenceFactory(Factory):
    name: ClassVar[str] = "reference"
    priority: ClassVar[int] = 100

    def probe(self) -> list[Device]:
        return [Device("numpy", kind="cpu", vendor="numpy " + np.__version__)]

    def create(self, device: Device, options: dict[str, Any] | None = None) -> ReferenceBackend:
        return ReferenceBackend(device, options)


@hookimpl
def hetero_register_backends(register) -> None:
    register(ReferenceFactory())
