"""Fuzzing the ONNX front end: mutated model files either load or raise HeteroError — never anything else."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import hetero
from conftest import make_model
from hetero.demo import tiny_cnn


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
