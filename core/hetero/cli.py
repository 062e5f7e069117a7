"""The ``hetero`` command: backends, run, demo; and the LLM commands generate, chat, bench."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .contract.errors import HeteroError


def _cmd_backends(args: argparse.Namespace) -> int:
    from .plugins import statuses

    rows = sorted(statuses(), key=lambda r: (r.priority, r.name))
    if args.json:
        print(json.dumps([
            {"name": r.name, "plugin": r.plugin, "distribution": r.distribution, "version": r.version,
             "status": r.status, "devices": [_device_text(d) for d in r.devices], "reason": r.reason, "hint": r.hint}
            for r in rows
        ], indent=2))
        return 0
    table = [("backend", "version", "status", "devices", "reason")]
    for r in rows:
        devices = "; ".join(_device_text(d) for d in r.devices) or "-"
        table.append((r.name, r.version, r.status, devices, r.reason + (f" (hint: {r.hint})" if r.hint else "")))
    widths = [max(len(row[c]) for row in table) for c in range(4)]
    for row in table:
        print("  ".join(row[c].ljust(widths[c]) for c in range(4)) + "  " + row[4])
    return 0


_DEVICE_FACTS = ("isa", "threads", "version", "compute_units", "fp16", "subgroups")


def _device_text(device) -> str:
    facts = [f"{k}={device.properties[k]}" for k in _DEVICE_FACTS if k in device.properties]
    if device.memory_bytes:
        facts.append(f"memory={device.memory_bytes / 2**30:.1f} GiB")
    vendor = f" [{device.vendor}]" if device.vendor else ""
    return f"{device.name}{vendor}" + (f" ({', '.join(facts)})" if facts else "")


def _parse_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise HeteroError(f"--input {spec!r}: expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise HeteroError(f"--input {name}: cannot read {path!r} as a .npy file: {exc}") from exc
    return feeds


def _random_inputs(session, given: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = dict(given)
    for name in session.input_names:
        if name in feeds:
            continue
        info = session.graph.values[name]
        if info.shape is None:
            raise HeteroError(f"input {name!r} has unknown rank: give it with --input {name}=FILE.npy")
        shape = [d if isinstance(d, int) else 1 for d in info.shape]
        np_dtype = info.dtype.np_dtype
        if np_dtype is None or np_dtype.kind not in "fiub":
            raise HeteroError(f"input {name!r} ({info}): give it with --input {name}=FILE.npy")
        if np_dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[name] = rng.integers(0, 10, shape).astype(np_dtype)
    return feeds


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime.session import Session

    backends = [b for spec in args.backend for b in spec.split(",") if b] or None
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        session = Session(args.model, backends=backends, on_fallback=args.on_fallback, threads=args.threads)
    load_ms = (time.perf_counter() - started) * 1e3
    feeds = _parse_inputs(args.input)
    missing = [n for n in session.input_names if n not in feeds]
    if missing and not args.random_inputs:
        raise HeteroError(f"missing input(s) {missing}: give --input NAME=FILE.npy, or --random-inputs")
    feeds = _random_inputs(session, feeds, args.seed)
    times = []
    outputs: dict[str, np.ndarray] = {}
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        outputs = session.run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    if args.explain:
        print(session.explain())
    np.set_printoptions(precision=5, threshold=12, edgeitems=3)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}\n{value}")
        if args.save_outputs:
            Path(args.save_outputs).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.save_outputs) / f"{name.replace('/', '_')}.npy", value)
    counts = ", ".join(f"{b}: {n}" for b, n in session.placement.counts().items())
    print(f"load {load_ms:.1f} ms; run median {statistics.median(times):.3f} ms over {len(times)} run(s) "
          f"(first {times[0]:.3f} ms); nodes per backend: {counts}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    backends = [b for spec in args.backend for b in spec.split(",") if b] or None
    return run_demo(batch=args.batch, repeats=args.repeat, backends=backends)


def _cmd_ops(args: argparse.Namespace) -> int:
    from .coverage import coverage, markdown

    cov = coverage()
    if args.markdown:
        print(markdown(cov), end="")
        return 0
    for backend in cov.backends:
        total = cov.count(backend, domain="")
        native = cov.count(backend, "native", domain="")
        print(f"{backend}: {total} ONNX ops ({native} native, {total - native} numpy), "
              f"{cov.count(backend) - total} hetero-domain ops")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetero", description="Run models on CPUs, GPUs and NPUs.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("backends", help="list installed backends: status, devices, reason")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_backends)

    p = sub.add_parser("run", help="run an ONNX model and print its outputs and timing")
    p.add_argument("model", help="path to a .onnx file")
    p.add_argument("-b", "--backend", action="append", default=[], help="backend(s) in preference order, e.g. cpu")
    p.add_argument("-i", "--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input value")
    p.add_argument("--random-inputs", action="store_true", help="fill inputs not given with seeded random data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-r", "--repeat", type=int, default=10, help="runs to time (median reported)")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--on-fallback", choices=["warn", "error", "silent"], default="warn")
    p.add_argument("--explain", action="store_true", help="print the placement of every node")
    p.add_argument("--save-outputs", metavar="DIR", help="save each output as DIR/NAME.npy")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("ops", help="op coverage per backend (native kernels vs numpy)")
    p.add_argument("--markdown", action="store_true", help="the full table, as in docs/ops.md")
    p.set_defaults(func=_cmd_ops)

    p = sub.add_parser("demo", help="run the built-in CNN on every available backend")
    p.add_argument("-b", "--backend", action="append", default=[])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("-r", "--repeat", type=int, default=20)
    p.set_defaults(func=_cmd_demo)

    from .llm.cli import add_llm_commands  # generate, chat, bench (light: imports nothing heavy until run)

    add_llm_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HeteroError as exc:
        print(f"hetero: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
