"""Where the RKNN software is: Rockchip's PC toolkit (``rknn-toolkit2``) in a venv of its own, and on a Rockchip
board the on-board runtime (``rknn-toolkit-lite2`` over ``librknnrt.so``) in the user's own Python.

``rknn-toolkit2`` 2.5.0 pins numpy<=1.26.4, onnx<=1.18 and torch<=2.4, which cannot share the user's environment;
its wheels are cp311 x86_64 (and aarch64). It installs with its other requirements first, then the wheel without
its dependency list, then a torch it runs with (its import needs torch, not that version), then setuptools<81
(it imports pkg_resources). ``python -m hetero_rknn setup`` runs these steps; ``HETERO_RKNN_VENV`` points to a
venv made some other way.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from hetero.contract.vendor_worker import VendorEnv

TOOLKIT_VERSION = "2.5.0"
SETUP_COMMAND = "python -m hetero_rknn setup"
ENV_VAR = "HETERO_RKNN_VENV"

TOOLKIT_ENV = VendorEnv(
    name="rknn",
    env_var=ENV_VAR,
    setup_command=SETUP_COMMAND,
    install_steps=[
        ["protobuf>=4.21.6,<=4.25.4", "psutil>=5.9", "ruamel.yaml>=0.17.21", "scipy>=1.9.3", "tqdm>=4.64.1",
         "opencv-python-headless>=4.5.5.64", "fast-histogram>=0.11", "numpy<=1.26.4", "onnx>=1.16.1,<=1.18.0",
         "onnxruntime>=1.17"],
        ["--no-deps", f"rknn-toolkit2=={TOOLKIT_VERSION}"],
        ["torch==2.13.0"],
        ["setuptools<81"],
    ],
    # Cheap on purpose (no `import rknn.api`: 5-8 s with torch): the package is there and says its version.
    check_code=(
        "import importlib.metadata as m, importlib.util as u, sys\n"
        "if u.find_spec('rknn') is None: sys.exit('the rknn package is not importable')\n"
        "print(m.version('rknn-toolkit2'))"
    ),
    base_pythons=("python3.11",),
    python_tag="3.11",
)

# The SoCs the backend documents; the toolkit knows more (rv1106, rk2118...), passed through as given.
TARGETS = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562")
DEFAULT_TARGET = "rk3588"
RUNTIME_LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/lib/aarch64-linux-gnu")


@dataclass(frozen=True)
class Board:
    """A Rockchip board this process runs on: its SoC (from the device tree) and what its runtime lacks."""

    soc: str
    missing: str = ""  # empty when rknn-toolkit-lite2 and librknnrt.so are both there


def board() -> Board | None:
    """The Rockchip SoC this machine is, or None (a PC, or another ARM board)."""
    if platform.machine() not in ("aarch64", "arm64"):
        return None
    try:
        compatible = Path("/proc/device-tree/compatible").read_bytes().decode("ascii", errors="replace")
    except OSError:
        return None
    soc = next((part.split(",", 1)[1] for part in compatible.split("\0") if part.startswith("rockchip,rk")), None)
    if soc is None:
        return None
    if importlib.util.find_spec("rknnlite") is None:
        return Board(soc, "the on-board runtime rknn-toolkit-lite2 is not installed (pip install rknn-toolkit-lite2)")
    if not any(Path(d, "librknnrt.so").exists() for d in RUNTIME_LIBRARY_DIRS):
        return Board(soc, "librknnrt.so is not installed (copy it from Rockchip's rknpu2 runtime to /usr/lib)")
    return Board(soc)


def simulated_on_this_machine() -> str | None:
    """Why the PC simulator cannot run here, or None when it can (rknn-toolkit2 ships x86_64 / aarch64 wheels)."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return f"rknn-toolkit2 has no wheels for {machine}"
    if os.name != "posix":
        return "rknn-toolkit2 runs on Linux only"
    return None
