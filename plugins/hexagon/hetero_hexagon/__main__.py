"""``python -m hetero_hexagon setup [--force]``: create the QNN toolkit venv (onnxruntime-qnn) the backend runs."""

from __future__ import annotations

import argparse
import sys

from hetero.contract import HeteroError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero_hexagon")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="create the QNN toolkit environment (onnxruntime-qnn, ~600 MB)")
    setup.add_argument("--force", action="store_true", help="remove an existing environment first")
    args = parser.parse_args(argv)
    from .qnn import QNN_ENV

    try:
        QNN_ENV.create(force=args.force)
    except HeteroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
