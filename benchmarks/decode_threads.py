"""Where an LLM decode step goes at 1 and 2 threads: the step's weight bytes per second against the N-thread read
bound (benchmarks/read_bandwidth.py), and the native thread pool's own account of its parallel regions: time in
the tasks, the wake-up of the workers, the caller waiting on a tail (imbalance, a late or descheduled worker),
the calls that ran on one thread, and what is left outside them (Python, single-threaded native code).

    python benchmarks/decode_threads.py [MODEL.gguf] [--synthetic qwen3-0.6b] [--quant q4] [--threads 1,2]
                                        [--spin 50] [--steps 32] [--rounds 4] [--per-op] [--clock cpu] [--json]
    python benchmarks/decode_threads.py [MODEL.gguf] --against /path/to/other/checkout [--rounds 6] ...

Every (threads, spin) configuration runs --steps decode steps (the cache rolled back to the same --prompt tokens
first, so every configuration sees the same context lengths) in each of --rounds interleaved rounds; figures are
medians over the steps of the configuration's quietest round (a neighbour on a shared machine only adds time).
--spin takes several values (microseconds a pool worker spins for the next call before it sleeps, see
``_native.set_pool_spin_us``): the configurations then compare spin settings in the same run.

Columns: ``step`` median step time; ``GB/s`` weight bytes of a step (every LlmWeights a kernel holds, the LM head
included) over the step time; ``%bound`` that over the best read bandwidth at the same thread count; per step:
``pooled`` / ``serial`` calls; ``busy/T`` time inside tasks summed over threads divided by the thread count;
``wake`` mean post-to-first-task latency of a joining worker; ``slept`` share of joins that began asleep;
``tail`` the caller's wait for the last task; ``outside`` step time not in any parallel region (Python, and the
native code that runs on the caller without the pool).

``--against TREE`` compares two builds before/after a change: each round runs this script once per checkout (this
one, then TREE: its ``core/`` and ``plugins/cpu``, extension modules included) in a fresh process, alternating, and
prints per thread count the median tok/s of each over the rounds and the median of the per-round ratios (this /
TREE). ``--against NAME=VALUE[,...]`` compares this checkout with itself under those environment settings
(``HETERO_LLM_TASKS=0``, ``HETERO_LLM_PF=0``: knobs read once per process). ``--tree TREE`` runs the
measurement on TREE's packages (what ``--against`` uses).

``--per-op`` adds, per thread count (at the first --spin value), one more pass in which every call of the session's
recorded replay is timed (what a step runs, after the backend's fusion; labelled by op type and, for QMatMul, the
projections: q_proj, ..., logits = the LM head, ``q_proj+k_proj+v_proj`` one fused call; the ops of a merged
``LlmStep`` are timed natively as it runs them back to back: ``LlmStep.timing``; in the process's CPU time with
--clock cpu at 1 thread, ``LlmStep.timing_cpu``, else wall time; with --clock cpu at N threads, wall time plus the
**clean runs**: each call's runs during which every pool thread's own CPU clock advanced by the wall interval and a
worker joined each of its regions (``LlmStep.timing_clean``, ``_native.pool_cpu_ns``): no thread preempted or
asleep, what a quiet machine runs. Then ``clean ms`` is the median clean run x the calls a step, ``clean %`` the
share of runs that were clean, GB/s come from the clean runs, and per op the clean regions' wall, busy/T, wake,
tail and idle in us are printed (idle: thread-time from each thread's last task end to the region's last one's,
the end spread of the work split); on a busy machine these are the 2-thread figures to read) and the pool's account
is read
after each call, so
the step splits per op into: ``wall`` the calls' time; ``work/T`` thread-time inside tasks (pooled) or in the call
(serial) over the thread count; ``wait`` = wall - work/T, the thread-average time the op's threads were not
computing (wake-ups, the barrier at the end, imbalance, for serial calls the idle other threads, and the call's own
Python / binding cost), of which ``tail`` (the caller waiting for the others) and ``wake/T`` (workers'
post-to-first-task latency); ``MiB`` weight bytes the op streams per step and ``GB/s`` over its wall time,
``%bound`` against the N-thread read bound. The wrappers and the per-call statistics read cost ~2 us a call outside
merged steps (~0.2 us inside): that pass's step is slower than the plain one (both printed). Not in any op: the
replay loop, ``Llm.forward`` and the session around it (instrumented step - the ops' wall).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from pool_clock import ran_throughout

ROOT = Path(__file__).resolve().parents[1]


def weight_bytes(llm) -> int:
    """Bytes of every block-quantized or float weight the cpu kernels hold (what a decode step streams)."""
    from hetero_cpu import _native

    seen: set[int] = set()
    total = 0
    for _, kernel in llm.session.kernels():
        for value in vars(kernel).values():
            if isinstance(value, _native.LlmWeights) and id(value) not in seen:
                seen.add(id(value))
                total += value.nbytes
    return total


def _weight_names(llm) -> dict[int, str]:
    """id(LlmWeights) -> the projection it belongs to (the node's last name part: q_proj, ..., logits)."""
    from hetero_cpu import _native

    names = {}
    for node, kernel in llm.session.kernels():
        for value in vars(kernel).values():
            if isinstance(value, _native.LlmWeights):
                names[id(value)] = node.name.rsplit(".", 1)[-1]
    return names


_NATIVE_OPS = {"rms_norm": "RMSNorm", "llm_swiglu": "SwiGLU", "llm_embedding": "Embedding", "binary": "Add"}


def _label(call, names: dict[int, str]) -> tuple[str, list]:
    """(per-op bucket, the LlmWeights it streams) of one call of a replay's program: the native function of a bound
    call (fused ones named after the projections they merge), else the kernel or closure behind it."""
    func = getattr(call, "func", None)
    args: tuple[Any, ...] = getattr(call, "args", ())
    if type(func).__name__ == "LlmRope":  # the rotary's bound call: the table itself
        return "RotaryEmbedding", []
    if func is None:  # a kernel's closure (attention, embedding): CpuEmbedding.bind.<locals>.call, AttentionCall
        qual = getattr(call, "__qualname__", type(call).__name__)
        return qual.split(".", 1)[0].removeprefix("Cpu").removesuffix("Call"), []
    name = getattr(func, "__name__", "")
    owner = getattr(func, "__self__", None)
    if name == "_run_dynamic":  # an entry the replay runs through kernel.run each time (e.g. the LM head)
        owner = args[1].kernel
    if owner is not None and hasattr(owner, "node"):
        op = owner.node.op_type
        w = getattr(owner, "w", None)
        return (f"{op} {names.get(id(w), '?')}" if op == "QMatMul" else op), ([w] if w is not None else [])
    if name == "llm_matmul":
        return f"QMatMul {names.get(id(args[0]), '?')}", [args[0]]
    if name == "llm_matmul_multi":
        return "QMatMul " + "+".join(names.get(id(w), "?") for w in args[0]), list(args[0])
    if name == "llm_matmul_swiglu":
        return f"QMatMul {names.get(id(args[0]), '?')}+{names.get(id(args[1]), '?')}+SwiGLU", list(args[:2])
    if name == "llm_matmul_residual":
        return f"QMatMul {names.get(id(args[0]), '?')}+Add", [args[0]]
    return _NATIVE_OPS.get(name, name), []


# --clock cpu: the process's CPU time (all threads). At 1 thread a neighbour taking the core away no longer counts
# (what is left: the kernels, the Python, and memory contention); at N threads it is about N x the wall time on a
# quiet machine (workers spin while they wait): the step's (and --per-op's ops') CPU time is divided by the thread
# count, and the read bound is the probe's CPU-time figure (each pass timed by its slowest thread's CPU time), so the
# GB/s compare with it. The pool's own figures (busy, wake, tail, serial) stay wall-clock ones.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}

STAT_KEYS = ("calls", "serial_calls", "joins", "sleeps", "busy_s", "tail_s", "wake_s", "serial_s", "wall_s",
             "idle_s")


def _replays(llm) -> list:
    from hetero.runtime.executor import KernelProgram

    return [p.replay for p in llm.session.programs if isinstance(p, KernelProgram) and p.replay is not None]


def per_op(llm, native, ids: list[int], prompt: int, steps: int, threads: int,
           clock: str = "wall") -> tuple[float, list[dict]]:
    """Per-op split of ``steps`` decode steps at ``threads`` threads (see the module doc): (median instrumented
    step seconds, rows). Every call of the recorded replay (after the backend's fusion) is wrapped. clock "cpu":
    an op's (and the step's) time is the process's CPU time over it divided by ``threads`` (see CLOCKS)."""
    # A merged step's ops in CPU time at 1 thread only: the process clock adds another thread's running time at
    # scheduler ticks (1-4 ms), so an op of ~0.1 ms on 2 threads would see a worker's time come and go at random.
    # There (--clock cpu, N threads) every op is timed by the wall clock and its clean runs kept apart: those during
    # which each pool thread's own CPU clock advanced by the wall interval (no thread preempted or asleep).
    native_cpu = clock == "cpu" and threads == 1
    clean_mode = clock == "cpu" and threads > 1
    now = time.perf_counter if clean_mode else CLOCKS[clock]
    per = threads if clock == "cpu" and not clean_mode else 1
    native.set_num_threads(threads)
    for _ in range(3):  # the replay of a one-token step at this thread count is recorded
        llm.rollback(prompt)
        llm.forward([ids[prompt]])
    names = _weight_names(llm)
    # per step: label -> wall seconds and the pool's account (medians over steps: a preempted step does not skew)
    steps_acc: list[dict[str, dict[str, float]]] = []
    nbytes: dict[str, int] = {}
    tick = statistics.median(-now() + now() for _ in range(1000))
    runs: dict[tuple[int, int], list[float]] = {}  # (replay call, op) -> wall seconds of each clean run
    seen: dict[tuple[int, int], int] = {}  # (replay call, op) -> runs
    key_label: dict[tuple[int, int], str] = {}
    clean_st: dict[str, dict[str, float]] = {}  # label -> the pool's account summed over the clean runs

    def account(label: str, dt: float, st: dict) -> None:
        a = steps_acc[-1].setdefault(label, dict.fromkeys(("wall", "n", *STAT_KEYS), 0.0))
        a["wall"] += dt
        a["n"] += 1
        for k in STAT_KEYS:
            a[k] += st[k]

    def timed(call, label: str, key: tuple[int, int]):
        key_label[key] = label

        def run() -> None:
            c0 = native.pool_cpu_ns() if clean_mode else None
            t0 = now()
            call()
            dt = (now() - t0 - tick) / per
            st = native.pool_stats(True)
            if c0 is not None:  # clean: every thread ran throughout and joined each region (LlmStep.timing_clean)
                c1 = native.pool_cpu_ns()
                seen[key] = seen.get(key, 0) + 1
                if st["joins"] >= st["calls"] and ran_throughout(c0, c1, dt):
                    runs.setdefault(key, []).append(dt)
            account(label, dt, st)

        return run

    def labelled(call) -> str:
        label, ws = _label(call, names)
        nbytes[label] = nbytes.get(label, 0) + sum(w.nbytes for w in ws)
        return label

    replays = _replays(llm)
    originals = [list(r.program) for r in replays]
    merged: list[tuple[Any, list[str], int]] = []  # the LlmSteps, timed natively, their ops' labels, their key
    try:
        for ri, r in enumerate(replays):
            wrapped = []
            for call in r.program:
                key = ri * 10**6 + len(wrapped)  # one per replay call
                if hasattr(call, "take_times"):  # a merged step (hetero_cpu.fuse.step_calls): its ops, one a call
                    call.timing = True
                    call.timing_cpu = native_cpu
                    call.timing_clean = clean_mode
                    call.take_times()
                    call.take_clean()
                    labels = [labelled(c) for c in call.fallback]
                    merged.append((call, labels, key))
                    for j, label in enumerate(labels):
                        key_label[(key, j)] = label
                    wrapped.append(call)
                else:
                    wrapped.append(timed(call, labelled(call), (key, -1)))
            r.program[:] = wrapped
        times = []
        for i in range(steps):
            llm.rollback(prompt)
            native.pool_stats(True)
            steps_acc.append({})
            t0 = now()
            llm.forward([ids[prompt + 1 + i % 8]])
            times.append((now() - t0) / per)
            for step, labels, _ in merged:
                for label, (dt, st) in zip(labels, step.take_times(), strict=False):
                    account(label, dt, st)
        if clean_mode:  # the merged steps' clean runs
            for step, _, key in merged:
                for j, (op_runs, st) in enumerate(step.take_clean()):
                    seen[(key, j)] = steps
                    if op_runs:
                        runs[(key, j)] = op_runs
                        cs = clean_st.setdefault(key_label[(key, j)], dict.fromkeys(STAT_KEYS, 0.0))
                        for k in STAT_KEYS:
                            cs[k] += st[k]
    finally:
        for step, _, _ in merged:
            step.timing = step.timing_cpu = step.timing_clean = False
        for r, program in zip(replays, originals, strict=True):
            r.program[:] = program
    rows: list[dict[str, Any]] = []
    zero = dict.fromkeys(("wall", "n", *STAT_KEYS), 0.0)

    def med(op: str, key: str) -> float:
        return statistics.median(st.get(op, zero)[key] for st in steps_acc)

    # label -> per-step seconds of the op's calls from its clean runs (the median clean run x its calls a step:
    # the calls of one label have one shape), clean runs, runs
    clean: dict[str, list[float]] = {}
    pooled_runs: dict[str, list[float]] = {}
    for key, label in key_label.items():
        c = clean.setdefault(label, [0.0, 0, 0])
        pooled_runs.setdefault(label, []).extend(runs.get(key, []))
        c[0] += 1
        c[2] += seen.get(key, 0)
    for label, c in clean.items():
        c[1] = len(pooled_runs[label])
        c[0] = c[0] * statistics.median(pooled_runs[label]) if c[1] else 0.0
    for op in {op for st in steps_acc for op in st}:
        w = med(op, "wall")
        pooled, serial = med(op, "calls"), med(op, "serial_calls")
        # Native code outside parallel_for (rotary, embedding) runs on the caller: count the call as one thread's.
        work = (med(op, "busy_s") + med(op, "serial_s") if pooled or serial else w) / threads
        joins = med(op, "joins")
        b = nbytes.get(op, 0)
        rows.append(dict(op=op, calls=med(op, "n"), pooled=pooled, serial=serial, wall_ms=w * 1e3,
                         work_ms=work * 1e3, wait_ms=(w - work) * 1e3, tail_ms=med(op, "tail_s") * 1e3,
                         wake_ms=med(op, "wake_s") / threads * 1e3,
                         slept_pct=100 * med(op, "sleeps") / joins if joins else 0.0,
                         mib=b / 2**20, gbps=b / w / 1e9 if w > 0 else 0.0))
        if clean_mode:  # the op's calls as a quiet machine runs them: GB/s from those
            c = clean.get(op, [0.0, 0, 0])
            rows[-1].update(clean_ms=c[0] * 1e3 if c[1] else None, clean_pct=100 * c[1] / c[2] if c[2] else 0.0)
            cs = clean_st.get(op)
            if cs and c[1] and cs["calls"]:  # per pooled clean run: region wall, busy / T, wake, tail, idle (us)
                rows[-1]["clean_region_us"] = {k: cs[k] / cs["calls"] * 1e6 / (threads if k == "busy_s" else 1)
                                               for k in ("wall_s", "busy_s", "wake_s", "tail_s", "idle_s")}
            if c[1] and c[0] > 0:
                rows[-1]["gbps"] = b / c[0] / 1e9
    rows.sort(key=lambda r: -r["wall_ms"])
    return statistics.median(times), rows


def print_per_op(threads: int, step_s: float, plain_s: float | None, rows: list[dict], bound: float | None) -> None:
    tot_w = sum(r["wall_ms"] for r in rows)
    tot_k = sum(r["work_ms"] for r in rows)
    plain = f", plain step {plain_s * 1e3:.2f} ms" if plain_s else ""
    print(f"\nper op, {threads} thread(s): instrumented step {step_s * 1e3:.2f} ms{plain}; in kernel calls "
          f"{tot_w:.2f} ms = work/T {tot_k:.2f} + wait {tot_w - tot_k:.2f} ms")
    has_clean = any("clean_ms" in r for r in rows)
    if has_clean:
        tot_c = sum(r["clean_ms"] or 0.0 for r in rows)
        print(f"clean runs (every thread ran throughout; GB/s from them): the ops sum to {tot_c:.2f} ms")
    print("| op | calls | pooled | serial | wall ms | % | work/T ms | wait ms | tail ms | wake/T ms | slept % |"
          + (" clean ms | clean % |" if has_clean else "") + " MiB | GB/s | %bound |")
    print("|---" * (16 if has_clean else 14) + "|")
    for r in rows:
        if "clean_region_us" in r:
            print(f"  clean {r['op']}: per region (us) " + ", ".join(
                f"{k[:-2]} {v:.1f}" for k, v in r["clean_region_us"].items()))
    for r in rows:
        pct = f"{100 * r['gbps'] / bound:.0f}" if bound and r["mib"] else "-"
        cl = ""
        if has_clean:
            cl = (f" {r['clean_ms']:.3f} |" if r["clean_ms"] is not None else " - |") + f" {r['clean_pct']:.0f} |"
        print(f"| {r['op']} | {r['calls']:.0f} | {r['pooled']:.0f} | {r['serial']:.0f} | {r['wall_ms']:.3f} |"
              f" {100 * r['wall_ms'] / tot_w:.1f} | {r['work_ms']:.3f} | {r['wait_ms']:.3f} | {r['tail_ms']:.3f} |"
              f" {r['wake_ms']:.3f} | {r['slept_pct']:.0f} |{cl} {r['mib']:.1f} | {r['gbps']:.1f} | {pct} |")


def run_config(llm, native, ids: list[int], prompt: int, steps: int,
               clock=time.perf_counter, per: int = 1) -> tuple[list[float], dict]:
    """Step times (``clock``'s seconds / ``per``) and the pool statistics summed over ``steps`` decode steps after
    ``prompt`` cached tokens."""
    llm.rollback(prompt)
    llm.forward([ids[prompt]])  # the first step after a thread-count change rebuilds the pool
    native.pool_stats(True)
    times = []
    for i in range(steps):
        llm.rollback(prompt)
        t0 = clock()
        llm.forward([ids[prompt + 1 + i % 8]])
        times.append((clock() - t0) / per)
    return times, native.pool_stats(True)


def compare(args: argparse.Namespace) -> int:
    """Alternate fresh processes of this script on this checkout and on ``args.against`` (see the module doc)."""
    import subprocess

    # The second arm: another checkout, or this one with environment settings (NAME=VALUE[,NAME=VALUE...]).
    env_b = dict(kv.split("=", 1) for kv in args.against.split(",")) if "=" in args.against else {}
    trees = [ROOT, ROOT if env_b else Path(args.against).resolve()]
    envs = [dict(os.environ), {**os.environ, **env_b}]
    child = [sys.executable, str(Path(__file__).resolve()), "--threads", args.threads,
             "--spin", args.spin.split(",")[0], "--steps", str(args.steps), "--prompt", str(args.prompt),
             "--rounds", "1", "--bandwidth-mib", "0", "--json", "--synthetic", args.synthetic, "--clock", args.clock,
             *(["--quant", args.quant] if args.quant else []), *([args.model] if args.model else [])]
    load_before = os.getloadavg()
    tok: dict[tuple[int, int], list[float]] = {}  # (tree, threads) -> tok/s per round
    name = ""
    for rnd in range(args.rounds):
        for i in (0, 1) if rnd % 2 == 0 else (1, 0):
            out = subprocess.run([*child, "--tree", str(trees[i])], check=True, capture_output=True, text=True,
                                 env=envs[i])
            res = json.loads(out.stdout)
            name = res["model"]
            for row in res["rows"]:
                tok.setdefault((i, row["threads"]), []).append(row["tok_s"])
    load_after = os.getloadavg()
    result: list[dict[str, Any]] = []
    for t in [int(x) for x in args.threads.split(",")]:
        a, b = tok[(0, t)], tok[(1, t)]
        result.append(dict(threads=t, this=statistics.median(a), against=statistics.median(b),
                           ratio=statistics.median(x / y for x, y in zip(a, b, strict=True)), this_runs=a,
                           against_runs=b))
    if args.json:
        print(json.dumps(dict(model=name, against=args.against, load_avg=[load_before[0], load_after[0]],
                              rows=result), indent=2))
        return 0
    print(f"{name}: this checkout vs {args.against}, {args.rounds} alternating rounds of {args.steps} steps; "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print("| T | this tok/s | against tok/s | ratio (median of rounds) | this runs | against runs |")
    print("|---|---|---|---|---|---|")
    for r in result:
        print(f"| {r['threads']} | {r['this']:.1f} | {r['against']:.1f} | {r['ratio']:.3f} |"
              f" {' '.join(f'{x:.1f}' for x in r['this_runs'])} | {' '.join(f'{x:.1f}' for x in r['against_runs'])} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a .gguf file or Hugging Face folder (default: a synthetic model)")
    ap.add_argument("--synthetic", default="qwen3-0.6b")
    ap.add_argument("--quant", default=None, help="quantize at load (synthetic default q4)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--spin", default="50", help="comma-separated pool spin times (us) to compare")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bandwidth-mib", type=int, default=256, help="MiB per thread of the read-bound probe (0: skip)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="cpu: the step's CPU time of the whole process over the thread count (see CLOCKS)")
    ap.add_argument("--per-op", action="store_true", help="also split each thread count's step per op (see above)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose core/ and plugins/cpu run")
    ap.add_argument("--against", default=None, help="compare with this checkout, or with this one under NAME=VALUE "
                    "environment settings (see above)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.against is not None:
        return compare(args)
    sys.path[:0] = [str(args.tree / "core"), str(args.tree / "plugins" / "cpu"), str(ROOT / "benchmarks")]
    from hetero.llm.synthetic import load_synthetic
    from hetero_cpu import _native

    threads = [int(t) for t in args.threads.split(",")]
    spins = [int(s) for s in args.spin.split(",")]
    load_before = os.getloadavg()
    bound = {}
    if args.bandwidth_mib:
        from read_bandwidth import measure

        bound = measure(threads, args.bandwidth_mib, reps=5, rounds=2, clock=args.clock)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.model:
            from hetero.llm import load

            llm = load(args.model, backends=["cpu"], on_fallback="silent", threads=max(threads), quant=args.quant,
                       context=args.prompt + 16, progress=False)
        else:
            llm = load_synthetic(args.synthetic, args.quant or "q4", backends=["cpu"], on_fallback="silent",
                                 threads=max(threads), context=args.prompt + 16, progress=False)
    nbytes = weight_bytes(llm)
    ids = list(range(1, args.prompt + 10))
    llm.prefill(ids[:args.prompt])
    configs = [(t, s) for t in threads for s in spins]
    rounds: dict[tuple[int, int], list[tuple[list[float], dict]]] = {c: [] for c in configs}
    spin_before = _native.pool_spin_us()
    _native.pool_stats_enable(True)
    try:
        for _ in range(args.rounds):
            for t, s in configs:
                _native.set_num_threads(t)
                _native.set_pool_spin_us(s)
                rounds[(t, s)].append(run_config(llm, _native, ids, args.prompt, args.steps, CLOCKS[args.clock],
                                                 t if args.clock == "cpu" else 1))
        ops = {}
        if args.per_op:
            _native.set_pool_spin_us(spins[0])
            ops = {t: per_op(llm, _native, ids, args.prompt, args.steps, t, args.clock) for t in threads}
    finally:
        _native.pool_stats_enable(False)
        _native.set_pool_spin_us(spin_before)
    load_after = os.getloadavg()
    rows = []
    for (t, s), runs in rounds.items():
        times, st = min(runs, key=lambda r: sum(r[0]))
        step = statistics.median(times)
        n = len(times)
        gbps = nbytes / step / 1e9
        joins = max(st["joins"], 1)
        rows.append(dict(threads=t, spin_us=s, step_ms=step * 1e3, tok_s=1 / step, gbps=gbps,
                         pct_bound=100 * gbps / bound[t]["best"] if t in bound else None,
                         pooled=st["calls"] / n, serial=st["serial_calls"] / n,
                         busy_ms=st["busy_s"] / n / t * 1e3, wall_ms=st["wall_s"] / n * 1e3,
                         wake_us=st["wake_s"] / joins * 1e6, slept_pct=100 * st["sleeps"] / joins,
                         late=st["late"] / n, tail_ms=st["tail_s"] / n * 1e3, serial_ms=st["serial_s"] / n * 1e3,
                         outside_ms=(sum(times) - st["wall_s"] - st["serial_s"]) / n * 1e3))
    result = dict(model=llm.name, weight_mib=nbytes / 2**20, load_avg=[load_before[0], load_after[0]],
                  read_bound_gbps={t: b["best"] for t, b in bound.items()}, rows=rows,
                  per_op={t: dict(step_ms=s * 1e3, ops=r) for t, (s, r) in ops.items()})
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    bounds = ", ".join(f"{t}T {b['best']:.1f} GB/s" for t, b in bound.items())
    print(f"{llm.name}: {nbytes / 2**20:.1f} MiB of weights per step; load average {load_before[0]:.2f} -> "
          f"{load_after[0]:.2f}; read bound (best) {bounds}")
    print("| T | spin us | step ms | tok/s | GB/s | %bound | pooled | serial | busy/T ms | pooled wall ms | wake us |"
          " slept % | tail ms | serial ms | outside ms |")
    print("|---" * 15 + "|")
    for r in rows:
        pct = "-" if r["pct_bound"] is None else f"{r['pct_bound']:.0f}"
        print(f"| {r['threads']} | {r['spin_us']} | {r['step_ms']:.2f} | {r['tok_s']:.1f} | {r['gbps']:.1f} | {pct} |"
              f" {r['pooled']:.0f} | {r['serial']:.0f} | {r['busy_ms']:.2f} | {r['wall_ms']:.2f} |"
              f" {r['wake_us']:.1f} | {r['slept_pct']:.0f} | {r['tail_ms']:.2f} | {r['serial_ms']:.2f} |"
              f" {r['outside_ms']:.2f} |")
    for t, (step_s, op_rows) in ops.items():
        plain = next((r["step_ms"] / 1e3 for r in rows if r["threads"] == t and r["spin_us"] == spins[0]), None)
        print_per_op(t, step_s, plain, op_rows, bound[t]["best"] if t in bound else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
