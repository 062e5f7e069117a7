"""The two quantized GEMM tiles of a few rows against each other (native: benchmarks/native/qgemm_rows.cpp, built
here against plugins/cpu/src): qgemm_mr (each row widens its int8 dots to int32 every step) and qgemm_rows (int16
sums over a block, the path AVX2 / AVX-512 without VNNI take for 2+ rows), thread CPU time for M = 2 / 4 / 8 rows
relative to one row, on the same packed q4_k / q6_k / q4_0 weights, alternated in one process; exits non-zero if
the two ever differ in a bit. ``--n 256`` keeps the weights in L2 (the compute cost alone).

    python benchmarks/qgemm_rows.py [--n 8960] [--k 1536] [--reps 15]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "qgemm_rows.cpp"
INCLUDE = HERE.parent / "plugins" / "cpu" / "src"
FLAGS = {"avx2": ["-mavx2", "-mfma", "-mf16c"],
         "avx512": ["-DROWS_AVX512", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mf16c"]}


def build(isa: str) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("qgemm_rows: no C++ compiler found (set CXX)")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [SOURCE, *sorted(INCLUDE.glob("llm*.hpp"))]))
    exe = Path(tempfile.gettempdir()) / f"hetero-qgemm-rows-{isa}-{digest.hexdigest()[:12]}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cxx, "-O3", "-std=c++17", *FLAGS[isa], f"-I{INCLUDE}", str(SOURCE), "-o", str(tmp)],
                       check=True)
        tmp.replace(exe)
    return exe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8960)
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--isa", action="append", choices=sorted(FLAGS), help="default: both (this CPU must run it)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for isa in args.isa or sorted(FLAGS):
        print(f"{isa}:", flush=True)
        subprocess.run([str(build(isa)), str(args.n), str(args.k), str(args.reps)], check=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
