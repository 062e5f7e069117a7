"""The rknn backend without Rockchip's toolkit: which nodes it claims and why, the ONNX it hands the toolkit
(checked with onnxruntime), its options, and what a user sees when the toolkit is missing, broken or crashing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import hetero
from hetero.contract import BackendError, Device, HeteroError, NodeInfo, Segment, TensorInfo, dtypes
from hetero.contract.graph import HETERO_DOMAIN, Node

from . import cnn
from .conftest import needs_plugin

pytestmark = needs_plugin


def _node_infos(graph) -> list[NodeInfo]:
    infos = []
    for node in graph.nodes:
        inputs = [graph.values.get(n) if n else None for n in node.inputs]
        outputs = [graph.values[n] for n in node.outputs]
        constants = {i: graph.initializers[n] for i, n in enumerate(node.inputs) if n in graph.initializers}
        infos.append(NodeInfo(node, inputs, outputs, constants, graph.opset(node.domain)))
    return infos


def _optimized_cnn():
    """The test CNN as a session sees it: folded, inferred, Conv+Relu and MatMul+Add fused."""
    return hetero.Session(cnn.build(), backends=["cpu"], on_fallback="silent").graph


def test_claims_the_npu_ops_and_says_why_not_the_others():
    from hetero_rknn.support import rknn_supports

    graph = _optimized_cnn()
    answers = {info.node.name: rknn_supports(info) for info in _node_infos(graph)}
    refused = {name: a.reason for name, a in answers.items() if not a}
    assert refused == {
        "gelu_erf/gelu": "Gelu is not in the RKNN NPU's op list",  # the erf form, fused by the passes
        "q_floor": "Floor is not in the RKNN NPU's op list",
        "q_abs": "Abs is not in the RKNN NPU's op list",
    }
    assert {n.op_type for n in graph.nodes if n.name in ("conv1", "fc")} == {"FusedConv", "FusedMatMul"}


def _conv(kernel: int, shape=(1, 3, 32, 32), dtype=dtypes.float32, stride: int = 1) -> NodeInfo:
    weight = np.zeros((8, 3, kernel, kernel), np.float32)
    out = (1, 8, 32, 32) if shape[0] is not None else (None, 8, 32, 32)
    node = Node("Conv", ["x", "w"], ["y"], {"strides": [stride, stride]}, "conv")
    return NodeInfo(node, [TensorInfo(dtype, shape), TensorInfo(dtypes.float32, weight.shape)],
                    [TensorInfo(dtype, out)], {1: weight}, 17)


@pytest.mark.parametrize(("info", "reason"), [
    (_conv(33), "Conv kernel [33, 33] (RKNN NPU limit: 1..31)"),
    (_conv(3, stride=8), "Conv strides [8, 8] (RKNN NPU limit: 1..7)"),
    (_conv(3, shape=(None, 3, 32, 32)), "Conv input 0 has no static shape (float32[?x3x32x32]): the RKNN compiler "
                                        "needs static shapes"),
    (_conv(3, dtype=dtypes.float16), "Conv on float16 (the rknn backend takes float32 tensors)"),
])
def test_refusals_name_the_limit(info, reason):
    from hetero_rknn.support import rknn_supports

    answer = rknn_supports(info)
    assert not answer and answer.reason == reason
    assert rknn_supports(_conv(3))


def test_exported_segment_computes_what_the_model_computes():
    """The whole optimized CNN as one segment: fused ops written out again, run by onnxruntime."""
    from hetero_rknn.export import segment_to_onnx

    graph = _optimized_cnn()
    segment = Segment(0, graph, _node_infos(graph))
    data = segment_to_onnx(segment)
    assert data == segment_to_onnx(segment)  # the bytes are the cache key's input: deterministic
    x = cnn.images(1)[0]
    got = ort.InferenceSession(data).run(None, {"x": x})
    want = ort.InferenceSession(cnn.build().SerializeToString()).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _backend(**options):
    from hetero_rknn.factory import RknnFactory

    return RknnFactory().create(Device("rknn simulator", kind="npu", properties={"mode": "simulator"}), options)


def test_options_are_checked():
    assert _backend().target == "rk3588" and _backend().dtype == "float16"
    assert _backend(rknn_target="RK3566").target == "rk3566"
    with pytest.raises(HeteroError, match="rknn_target='imx8' is not a Rockchip SoC name"):
        _backend(rknn_target="imx8")
    with pytest.raises(HeteroError, match="rknn_dtype='int4'; expected one of float16, int8"):
        _backend(rknn_dtype="int4")
    with pytest.raises(HeteroError, match="rknn_dtype='int8' needs rknn_calibration"):
        _backend(rknn_dtype="int8")


def test_int8_calibration_must_hold_each_segment_input():
    graph = _optimized_cnn()
    segment = Segment(2, graph, _node_infos(graph))
    backend = _backend(rknn_dtype="int8", rknn_calibration=[{"x": np.zeros((1, 3, 16, 16), np.float32)}])
    with pytest.raises(HeteroError, match=r"'x' has shape \(1, 3, 16, 16\), segment 2 .* reads it as \(1, 3, 32, 32\)"):
        backend.calibration_for(segment, "segment 2 (19 nodes)")
    backend = _backend(rknn_dtype="int8", rknn_calibration=[{"y": np.zeros(3)}])
    with pytest.raises(HeteroError, match="sample 0 has no value 'x', which segment 2 reads"):
        backend.calibration_for(segment, "segment 2")


# -- the toolkit missing, broken, crashing: each in a fresh process, as a user meets it -------------------------------

def _run(code: str, venv: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HETERO_RKNN_VENV": os.fspath(venv), "PYTHONWARNINGS": "always"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


_STATUS = ("import hetero, json; row = hetero.plugins.status('rknn'); "
           "print(json.dumps([row.status, row.reason, row.hint]))")


def _model_file(tmp_path: Path) -> str:
    path = tmp_path / "cnn.onnx"
    path.write_bytes(cnn.build().SerializeToString())
    return repr(os.fspath(path))


def _fake_venv(tmp_path: Path, python_script: str | None) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    if python_script is None:
        python.symlink_to(sys.executable)  # a Python without rknn-toolkit2
    else:
        python.write_text(python_script)
        python.chmod(0o755)
    return venv


def test_missing_toolkit_is_a_status_line_and_a_clear_error(tmp_path):
    done = _run(_STATUS, tmp_path / "nowhere")
    status, reason, hint = json.loads(done.stdout)
    assert status == "unavailable"
    assert reason == f"no rknn toolkit environment at {tmp_path / 'nowhere'} (HETERO_RKNN_VENV)"
    assert hint == "create it: python -m hetero_rknn setup (or point HETERO_RKNN_VENV to one)"
    done = _run("import hetero\ntry:\n    hetero.Session(" + _model_file(tmp_path) +
                ", backends=['rknn'])\nexcept hetero.HeteroError as e:\n    print(type(e).__name__, e)", tmp_path / "x")
    assert "BackendUnavailable requested backends cannot start:\n  rknn: unavailable: no rknn toolkit" in done.stdout
    assert "python -m hetero_rknn setup" in done.stdout


def test_broken_toolkit_says_what_fails(tmp_path):
    done = _run(_STATUS, _fake_venv(tmp_path, None))
    status, reason, hint = json.loads(done.stdout)
    assert status == "unavailable" and "is not usable: the rknn package is not importable" in reason, reason
    assert hint == "recreate it: python -m hetero_rknn setup --force"


def test_crashing_toolkit_python_leaves_hetero_working(tmp_path):
    venv = _fake_venv(tmp_path, "#!/bin/sh\nkill -SEGV $$\n")
    code = (_STATUS + "\nimport numpy as np\ns = hetero.Session(" + _model_file(tmp_path) +
            ", backends=['rknn', 'cpu'])\nprint(sorted(s.run({'x': np.zeros((1, 3, 32, 32), np.float32)})))")
    done = _run(code, venv)
    status, reason, _ = json.loads(done.stdout.splitlines()[0])
    assert status == "unavailable" and reason.endswith("is not usable: killed by SIGSEGV"), reason
    assert done.stdout.splitlines()[1] == "['logits', 'steps']"  # the session ran on cpu
    assert "backend skipped (rknn: unavailable" in done.stderr  # with one warning saying why


def test_on_a_board_a_segment_needs_its_file_built_on_a_pc(tmp_path, monkeypatch):
    """Device mode loads each segment's .rknn from the cache (built by a PC for the same options): without it the
    error names the segment, the target and the folder, before any worker starts."""
    from hetero_rknn.factory import RknnFactory

    monkeypatch.setenv("HETERO_CACHE_DIR", os.fspath(tmp_path))
    backend = RknnFactory().create(Device("rk3588 NPU", kind="npu", properties={"mode": "device", "soc": "rk3588"}))
    graph = _optimized_cnn()
    with pytest.raises(BackendError) as info:
        backend.compile(Segment(0, graph, _node_infos(graph)[:5]))
    assert info.value.message.startswith("no built RKNN model for segment 0 (5 nodes: ")
    assert info.value.message.endswith(f"(rk3588, float16) in {tmp_path / 'rknn'}")
    assert "run the same session there with the rknn backend (simulator)" in info.value.hint
    assert len(list((tmp_path / "rknn").glob("*.onnx"))) == 1  # what a PC would convert, under the same key



def test_fusions_to_ops_rknn_lacks_are_left_out_when_it_comes_first():
    """Add -> Relu stays two nodes the NPU takes instead of one cpu-only AddRelu that would fall back to cpu; a Conv
    -> Relu still becomes the FusedConv the NPU takes (its export writes the two nodes out again)."""
    from hetero_rknn.support import rknn_supports

    from hetero.ir import passes

    backend = _backend()
    assert backend.takes_op_type("", "Add") and backend.takes_op_type("", "Relu")
    assert backend.takes_op_type(HETERO_DOMAIN, "FusedConv")
    assert not backend.takes_op_type(HETERO_DOMAIN, "AddRelu") and not backend.takes_op_type("", "Floor")
    names = {p.__name__ for p in passes.for_backend(lambda key: backend.takes_op_type(*key))}
    assert "fuse_add_relu" not in names and "fuse_matmul_gelu" not in names
    assert "fuse_conv_activation" in names
    # the conformance kit's rule: every op whose node supports() accepts is one takes_op_type() says yes to
    accepted = [info for info in _node_infos(_optimized_cnn()) if rknn_supports(info)]
    assert accepted and all(backend.takes_op_type(info.domain, info.op_type) for info in accepted)
