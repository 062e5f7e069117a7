"""``python -m hetero_hexagon setup [--force]``: create the QNN toolkit venv (onnxruntime-qnn) the backend runs;
``python -m hetero_hexagon status``: what the HTP and the HVX kernels can run on here (exit 1 when QNN cannot)."""

from __future__ import annotations

import argparse
import sys

from hetero.contract import HeteroError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero_hexagon")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="create the QNN toolkit environment (onnxruntime-qnn, ~550 MB)")
    setup.add_argument("--force", action="store_true", help="remove an existing environment first")
    commands.add_parser("status", help="say whether the HTP runs here (device / simulator) and where HVX kernels run")
    args = parser.parse_args(argv)
    from .factory import hvx_mode
    from .qnn import QNN_ENV, check_toolkit, mode

    try:
        if args.command == "setup":
            QNN_ENV.create(force=args.force)
        version = check_toolkit()
        print(f"hexagon: HTP {mode()} through onnxruntime-qnn {version} ({QNN_ENV.path}); HVX kernels: {hvx_mode()}")
    except HeteroError as exc:
        print(f"hexagon: unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
