"""``python -m hetero_rknn setup [--force]``: create the rknn-toolkit2 venv (with progress);
``python -m hetero_rknn status``: which mode this machine offers, or why none."""

from __future__ import annotations

import argparse
import sys

from hetero.contract import HeteroError

from .factory import RknnFactory
from .toolkit import ENV_VAR, TOOLKIT_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero_rknn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help=f"create the rknn-toolkit2 venv at {TOOLKIT_ENV.path} ({ENV_VAR})")
    setup.add_argument("--force", action="store_true", help="remove an existing venv first")
    commands.add_parser("status", help="the mode this machine offers: device, simulator or unavailable")
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            TOOLKIT_ENV.create(force=args.force)
            return 0
        devices = RknnFactory().probe()
        for device in devices:
            facts = ", ".join(f"{k}={v}" for k, v in device.properties.items())
            print(f"{device.name}: {facts}")
        return 0
    except HeteroError as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
