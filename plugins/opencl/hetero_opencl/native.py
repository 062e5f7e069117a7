"""Loads the native module (``hetero_opencl._native``) on first use, so that importing the plugin loads no native
code; every way it can fail is a ``BackendUnavailable`` with the fix."""

from __future__ import annotations

from typing import Any

from hetero.contract import BackendUnavailable


def load_native() -> Any:
    """The native module, or ``BackendUnavailable`` naming what is missing and the fix."""
    try:
        from . import _native
    except ImportError as exc:
        if "libOpenCL" in str(exc):
            raise BackendUnavailable(
                f"the OpenCL ICD loader (libOpenCL.so.1) is missing: {exc}",
                hint="apt-get install ocl-icd-libopencl1 pocl-opencl-icd",
            ) from exc
        raise BackendUnavailable(
            f"the native module hetero_opencl._native does not import: {exc}",
            hint="reinstall the plugin from a checkout: pip install --force-reinstall ./plugins/opencl",
        ) from exc
    if not _native.built_with_opencl:
        raise BackendUnavailable(
            "hetero-opencl was built without the OpenCL headers and ICD loader",
            hint="apt-get install ocl-icd-opencl-dev opencl-headers; then pip install --force-reinstall "
                 "./plugins/opencl",
        )
    return _native
