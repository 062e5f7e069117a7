"""Fuzzing the ONNX front end and the sessions of every backend: mutated models either run or raise HeteroError —
never another exception, a native crash, a hang or a memory bomb.

The byte-level tests load in-process (the front end is Python). The graph-mutation tests run each case in a child
process (``hetero.testing.fuzz.ChildRunner``), so a crash or a hang is a finding, not the end of the run. Bounded by
default (a few seconds per backend); a long run:

    HETERO_FUZZ_EXAMPLES=5000 HETERO_FUZZ_SEED=123 pytest tests/test_fuzz_onnx.py -k mutations

Each failing case is written under the pytest tmp dir and named in the failure; add it to
``tests/fixtures/fuzz_onnx/`` (README there) so that it stays a regression test. Coverage-guided runs use atheris:
``python -m hetero.testing.onnx_fuzz --help``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero.demo import tiny_cnn
from hetero.testing.fuzz import ChildRunner, Outcome
from hetero.testing.onnx_fuzz import BACKENDS, encode_case, mutate


def _seed_models() -> list[bytes]:
    reshape = make_model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"]),
         helper.make_node("Concat", ["r", "r"], ["c"], axis=0), helper.make_node("Transpose", ["c"], ["y"])],
        [("x", TensorProto.FLOAT, ["N", 3])], [("y", TensorProto.FLOAT, [3, None])],
    )
    gemm = make_model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
        [("x", TensorProto.FLOAT, [2, 4])], [("y", TensorProto.FLOAT, [2, 3])],
        [("w", np.ones((3, 4), np.float32)), ("b", np.arange(3, dtype=np.float32))],
    )
    return [m.SerializeToString() for m in (tiny_cnn(batch=1, image=8), reshape, gemm)]


SEEDS = _seed_models()


def _load_and_prepare(data: bytes) -> None:
    try:
        graph = hetero.load(data)
        hetero.Session(graph, backends=["reference"], on_fallback="silent")
    except hetero.HeteroError:
        pass  # a clear, expected refusal


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(range(len(SEEDS))),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_byte_mutations(seed: int, flips: list[tuple[float, int]]) -> None:
    data = bytearray(SEEDS[seed])
    for where, value in flips:
        data[int(where * len(data))] = value
    _load_and_prepare(bytes(data))


@settings(max_examples=100, deadline=None)
@given(seed=st.sampled_from(range(len(SEEDS))), cut=st.floats(0, 1))
def test_truncations(seed: int, cut: float) -> None:
    data = SEEDS[seed]
    _load_and_prepare(data[: int(cut * len(data))])


@settings(max_examples=100, deadline=None)
@given(seed=st.sampled_from(range(len(SEEDS))), at=st.floats(0, 1), junk=st.binary(min_size=1, max_size=32))
def test_insertions(seed: int, at: float, junk: bytes) -> None:
    data = SEEDS[seed]
    pos = int(at * len(data))
    _load_and_prepare(data[:pos] + junk + data[pos:])


@pytest.mark.parametrize("dims", [[-1, 4], [1 << 40, 1 << 40], [0, 3]])
def test_absurd_initializer_dims(dims: list[int]) -> None:
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [3])],
                       [("y", TensorProto.FLOAT, [3])], [("w", np.ones(3, np.float32))])
    tensor = model.graph.initializer[0]
    del tensor.dims[:]
    tensor.dims.extend(dims)
    # the tensor's dims now disagree with its data
    with pytest.raises(hetero.HeteroError):
        hetero.Session(model, backends=["reference"])


# -- graph mutation through a session, each case in a child process ---------------------------------------------------
CORPUS = Path(__file__).parent / "fixtures" / "fuzz_onnx"
EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "60"))
BASE_SEED = int(os.environ.get("HETERO_FUZZ_SEED", random.randrange(1 << 30)))
CASE_TIMEOUT = 60.0  # seconds for one case (loading + placing + running); a hang is a finding
CHILD_MEMORY = 6 << 30  # RLIMIT_DATA of the worker: a memory bomb ends as MemoryError, a finding


def _available(backend: str) -> bool:
    try:
        hetero.Session(SEEDS[2], backends=[backend])
    except hetero.HeteroError:
        return False
    return True


BACKEND_PARAMS = [pytest.param(b, marks=pytest.mark.skipif(not _available(b), reason=f"no {b} backend here"))
                  for b in BACKENDS]


def _mutation_seeds() -> list[bytes]:
    """The node-test suite's models (cached by tests/onnx_conformance) and the small seeds above."""
    from onnx_conformance.cases import load_cases

    return [case.model for case in load_cases()] + SEEDS


def _report(findings: list[tuple[str, Outcome, Path]]) -> str:
    lines = [f"{len(findings)} bad outcome(s) (HETERO_FUZZ_SEED={BASE_SEED}):"]
    lines += [f"  {what}: {outcome.kind}: {outcome.detail.splitlines()[0][:300]}\n    case: {path}"
              for what, outcome, path in findings]
    return "\n".join(lines)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_graph_mutations_through_a_session(backend: str, tmp_path: Path) -> None:
    seeds = _mutation_seeds()
    findings = []
    with ChildRunner("hetero.testing.onnx_fuzz:run_case", timeout=CASE_TIMEOUT, memory_bytes=CHILD_MEMORY) as runner:
        for i in range(EXAMPLES):
            rng = random.Random(BASE_SEED * 1_000_003 + i)
            seed = onnx.ModelProto()
            seed.ParseFromString(seeds[rng.randrange(len(seeds))])
            model, applied = mutate(seed, rng)
            data = model.SerializeToString()
            outcome = runner.run(encode_case(backend, data))
            if outcome.bad:
                path = tmp_path / f"{backend}-{BASE_SEED}-{i}.onnx"
                path.write_bytes(data)
                findings.append((f"case {i} ({seed.graph.name}, {', '.join(applied)})", outcome, path))
    assert not findings, _report(findings)


def _corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.onnx"))


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_regression_corpus(backend: str, tmp_path: Path) -> None:
    """Every model that once crashed, hung, bombed or raised a raw exception now runs or is refused cleanly."""
    assert _corpus(), f"no corpus in {CORPUS}"
    findings = []
    with ChildRunner("hetero.testing.onnx_fuzz:run_case", timeout=CASE_TIMEOUT, memory_bytes=CHILD_MEMORY) as runner:
        for path in _corpus():
            outcome = runner.run(encode_case(backend, path.read_bytes()))
            if outcome.bad:
                findings.append((path.name, outcome, path))
    assert not findings, _report(findings)


def test_child_runner_reports_crashes_and_hangs() -> None:
    """The runner itself: a native crash, a hang and a raw exception are findings, and the worker comes back."""
    with ChildRunner("hetero.testing.fuzz:selftest_target", timeout=5) as runner:
        outcomes = [runner.run(case) for case in (b"crash", b"fine", b"hang", b"raise", b"fine")]
    assert [o.kind for o in outcomes] == ["crashed", "ok", "hung", "raised", "ok"]
    assert "SIGSEGV" in outcomes[0].detail and "KeyError: 'selftest'" in outcomes[3].detail
    assert runner.restarts == 2


def test_run_case_refuses_a_broken_model_cleanly() -> None:
    with ChildRunner("hetero.testing.onnx_fuzz:run_case", timeout=CASE_TIMEOUT) as runner:
        assert runner.run(encode_case("reference", SEEDS[2])).kind == "ok"
        assert runner.run(encode_case("reference", b"not a model")).kind == "refused"
