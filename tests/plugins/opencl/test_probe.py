"""Discovery: what `hetero backends` says with a device, and the unavailable paths (no ICD, explicit request)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hetero

from .conftest import REASON, needs_device

pytest.importorskip("hetero_opencl")


def backends_json(env_extra: dict[str, str]) -> list[dict]:
    import os

    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-m", "hetero.cli", "backends", "--json"], capture_output=True,
                         text=True, env=env, check=True, timeout=120)
    return json.loads(out.stdout)


def native_build() -> str:
    """How this machine's hetero_opencl._native was built: "opencl" (headers and ICD loader found), "stub" (built
    without them: a fresh machine with no OpenCL packages) or "no-loader" (built with them, libOpenCL.so.1 gone)."""
    try:
        from hetero_opencl import _native
    except ImportError as exc:
        if "libOpenCL" in str(exc):
            return "no-loader"
        raise
    return "opencl" if _native.built_with_opencl else "stub"


# Without a driver, what `hetero backends` must say for each way the plugin can have been built: (reason, hint).
WITHOUT_A_DRIVER = {
    "opencl": ("no OpenCL platform", "pocl-opencl-icd"),
    "stub": ("built without the OpenCL headers", "opencl-headers"),
    "no-loader": ("ICD loader (libOpenCL.so.1) is missing", "ocl-icd-libopencl1"),
}


def test_no_icd_is_a_status_line_with_the_fix(tmp_path: Path) -> None:
    empty = tmp_path / "vendors"
    empty.mkdir()
    rows = {r["name"]: r for r in backends_json({"OCL_ICD_VENDORS": str(empty)})}
    row = rows["opencl"]
    reason, hint = WITHOUT_A_DRIVER[native_build()]
    assert row["status"] == "unavailable"
    assert reason in row["reason"], row
    assert hint in row["hint"], row
    assert rows["cpu"]["status"] == "ok"  # the others are unaffected


def test_status_follows_the_build_and_the_driver() -> None:
    """A stub build is unavailable even where a driver is installed, and says how to fix it; a real build is ok
    exactly where the conftest's probe found a device."""
    row = {r["name"]: r for r in backends_json({})}["opencl"]
    if native_build() == "stub":
        assert row["status"] == "unavailable"
        assert "built without the OpenCL headers" in row["reason"]
        assert "pip install --force-reinstall ./plugins/opencl" in row["hint"]
    elif REASON is None:
        assert row["status"] == "ok", row
    else:
        assert row["status"] == "unavailable"
        assert row["reason"] in REASON


def test_explicit_request_without_device_raises(tmp_path: Path) -> None:
    empty = tmp_path / "vendors"
    empty.mkdir()
    code = ("import hetero\n"
            "from onnx import TensorProto, helper\n"
            "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [2])\n"
            "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [2])\n"
            "g = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g', [x], [y])\n"
            "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)])\n"
            "try:\n"
            "    hetero.Session(m, backends=['opencl'])\n"
            "except hetero.HeteroError as exc:\n"
            "    print('RAISED', exc)\n")
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OCL_ICD_VENDORS": str(empty)})
    assert "RAISED" in out.stdout, out.stdout + out.stderr
    assert "opencl" in out.stdout
    assert WITHOUT_A_DRIVER[native_build()][0] in out.stdout  # the same reason as `hetero backends` gives


@needs_device
def test_devices_report_their_facts() -> None:
    rows = {r.name: r for r in hetero.backends()}
    row = rows["opencl"]
    assert row.status == "ok"
    device = row.devices[0]
    assert device.name and device.vendor and device.memory_bytes
    for key in ("version", "fp16", "subgroups", "compute_units", "driver_version"):
        assert key in device.properties
    assert "OpenCL" in device.properties["version"]
