"""Discovery: what `hetero backends` says with a device, and the unavailable paths (no ICD, explicit request)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hetero

from .conftest import needs_device

pytest.importorskip("hetero_opencl")


def backends_json(env_extra: dict[str, str]) -> list[dict]:
    import os

    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-m", "hetero.cli", "backends", "--json"], capture_output=True,
                         text=True, env=env, check=True, timeout=120)
    return json.loads(out.stdout)


def test_no_icd_is_a_status_line_with_the_fix(tmp_path: Path) -> None:
    empty = tmp_path / "vendors"
    empty.mkdir()
    rows = {r["name"]: r for r in backends_json({"OCL_ICD_VENDORS": str(empty)})}
    row = rows["opencl"]
    assert row["status"] == "unavailable"
    assert "no OpenCL platform" in row["reason"]
    assert "pocl-opencl-icd" in row["hint"]
    assert rows["cpu"]["status"] == "ok"  # the others are unaffected


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
