"""The OpenCL backend's tests run only where an OpenCL device exists (PoCL in CI: apt-get install pocl-opencl-icd);
elsewhere they skip with the reason. Kernel sizes stay small: PoCL compiles each program for seconds the first
time (then it is cached, by hetero in ~/.cache/hetero/opencl and by PoCL in ~/.cache/pocl)."""

from __future__ import annotations

import pytest

from hetero.contract import BackendUnavailable


def opencl_unavailable() -> str | None:
    try:
        from hetero_opencl.factory import list_devices
    except ImportError:
        return "hetero-opencl is not installed (pip install ./plugins/opencl)"
    try:
        list_devices()
    except BackendUnavailable as exc:
        return f"no OpenCL device: {exc.message}"
    return None


REASON = opencl_unavailable()
needs_device = pytest.mark.skipif(REASON is not None, reason=REASON or "")
