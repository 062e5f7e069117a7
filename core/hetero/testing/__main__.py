"""``python -m hetero.testing``: run the conformance kit and print PASS/FAIL per check with the reason."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import plugins
from . import conformance


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero.testing", description=__doc__)
    parser.add_argument("--backend", action="append", help="backend to check (repeatable; default: every installed)")
    parser.add_argument("--op", action="append", help="limit the op checks to these ops (repeatable)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only failures and the summary")
    args = parser.parse_args(argv)

    def show(result: conformance.Result) -> None:
        if not args.quiet or result.status == conformance.FAIL:
            print(result, flush=True)

    names = args.backend
    if not names:  # every installed backend; one that cannot start here is a status line, not a failure
        names = []
        for row in plugins.statuses():
            if row.ok:
                names.append(row.name)
            else:
                print(f"{conformance.SKIP}  {row.name}  {row.status}: {row.reason}")
    failed = False
    for name in names:
        try:
            report = conformance.check_backend(name, args.op, on_result=show)
        except ValueError as exc:  # an --op without a case
            parser.error(str(exc))
        print(report.summary(), flush=True)
        failed |= not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
