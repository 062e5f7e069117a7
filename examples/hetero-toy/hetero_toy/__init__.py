"""hetero-toy: a backend for hetero that runs Relu and Add with numpy, one "device" per HETERO_TOY_DEVICES.

This module is what the entry point names, so it stays light: it states the plugin API it was written for and
registers a factory. The kernels (a real backend's compiled extension) load only when the factory needs them.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from hetero.contract import Backend, BackendUnavailable, Device, Factory, hookimpl

# The version of hetero's plugin contract (hetero.contract) this package was written against. hetero refuses a
# different major version before it calls anything else here, so write the number down: never copy
# hetero.API_VERSION, which would claim every future version too.
api_version = "2.0"


class ToyFactory(Factory):
    name: ClassVar[str] = "toy"
    priority: ClassVar[int] = 40  # asked before cpu (50) when the user names no backend

    def probe(self) -> list[Device]:
        try:
            from . import backend  # noqa: F401  (a real plugin imports its native extension here)
        except ImportError as exc:
            raise BackendUnavailable(
                f"the toy kernels cannot be imported: {exc}", hint="pip install --force-reinstall hetero-toy"
            ) from exc
        count = int(os.environ.get("HETERO_TOY_DEVICES", "1"))
        if count < 1:
            raise BackendUnavailable(
                f"no toy device: HETERO_TOY_DEVICES={count}", hint="unset HETERO_TOY_DEVICES, or set it to 1"
            )
        return [Device(f"toy{i}", kind="cpu", vendor="hetero-toy") for i in range(count)]

    def create(self, device: Device, options: dict[str, Any] | None = None) -> Backend:
        from .backend import ToyBackend

        return ToyBackend(device, options)


@hookimpl
def hetero_register_backends(register) -> None:
    register(ToyFactory())
