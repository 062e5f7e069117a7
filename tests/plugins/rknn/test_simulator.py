"""The rknn backend on rknn-toolkit2's simulator: models split between the simulated NPU and cpu, against
onnxruntime; int8 with a calibration set; the cache; a converter that aborts; a worker killed under a session.

Tolerances (measured on the test CNN, 8 smooth random images, rk3588): float16 builds differ from onnxruntime by at
most 1.3e-3 on logits whose range is 1.8 (7e-4 of the range); int8 builds by 3.2e-2 (2% of the range), with the
same top class on all 8. The tests allow 4x that: 3e-3 and 8% of the range.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import hetero
from hetero.contract import BackendError

from . import cnn
from .conftest import needs_toolkit

pytestmark = needs_toolkit

FLOAT_TOLERANCE = 3e-3  # of the output's range (max |x|)
INT8_TOLERANCE = 0.08


def _ort_values(model: onnx.ModelProto, feeds: dict, names: list[str]) -> dict[str, np.ndarray]:
    """Any values of the model, intermediate ones too, computed by onnxruntime (int8 calibration samples)."""
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    known = {o.name for o in extended.graph.output}
    extended.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in known)
    return dict(zip(names, ort.InferenceSession(extended.SerializeToString()).run(names, feeds), strict=True))


def _worst(session, reference, images, output: str = "logits") -> tuple[float, int]:
    worst, same_class = 0.0, 0
    for x in images:
        got, want = session.run({"x": x})[output], reference.run([output], {"x": x})[0]
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        same_class += int(got.argmax() == want.argmax())
    return worst, same_class


def test_cnn_splits_between_the_npu_and_cpu(rknn_cache):
    model = cnn.build()
    session = hetero.Session(model, backends=["rknn", "cpu"], on_fallback="silent")
    text = session.explain()
    for name in ("gelu_erf", "q_floor", "q_abs"):
        line = next(line for line in text.splitlines() if line.startswith(name))
        assert " cpu " in line and "is not in the RKNN NPU's op list" in line, line
    line = next(line for line in text.splitlines() if line.startswith("conv1 "))
    assert "FusedConv" in line and " rknn " in line, line
    # the erf GELU fused to one Gelu (cpu), the residual block's conv and Add to one ConvResidual (rknn)
    assert "nodes per backend: rknn: 11, cpu: 3; segments: 5" in text
    reference = ort.InferenceSession(model.SerializeToString())
    worst, same = _worst(session, reference, cnn.images(4))
    assert worst < FLOAT_TOLERANCE and same == 4, (worst, same)
    x = cnn.images(1)[0]
    steps, want = session.run({"x": x})["steps"], reference.run(["steps"], {"x": x})[0]
    assert np.abs(steps - want).max() <= 0.25  # Floor may step once where the float16 logit sits on a boundary

    built = sorted(p.name for p in rknn_cache.iterdir())  # segments 0, 2, 4 built (1 and 3 are cpu)
    assert len(built) == 9 and {p.rsplit(".", 1)[1] for p in built} == {"onnx", "rknn", "json"}, built
    facts = json.loads(next(rknn_cache.glob("*.json")).read_text())
    assert facts["target"] == "rk3588" and facts["dtype"] == "float16" and facts["rknn_bytes"] > 0


def test_int8_with_a_calibration_set(rknn_cache):
    model = cnn.build()
    images = cnn.images(24)
    needed = ["g4", "p1", "q2"]  # the intermediate values the 2nd and 3rd rknn segments read
    calibration = [{"x": x, **_ort_values(model, {"x": x}, needed)} for x in images[:16]]
    session = hetero.Session(model, backends=["rknn", "cpu"], on_fallback="silent",
                             options={"rknn_dtype": "int8", "rknn_calibration": calibration})
    worst, same = _worst(session, ort.InferenceSession(model.SerializeToString()), images[16:])
    assert worst < INT8_TOLERANCE and same >= 7, (worst, same)
    assert {json.loads(p.read_text())["dtype"] for p in rknn_cache.glob("*.json")} == {"int8"}


def test_targets_get_their_own_builds_and_a_rebuilt_session_reuses_the_worker(rknn_cache):
    from hetero_rknn.factory import worker

    model = cnn.build()
    x = cnn.images(1)[0]
    first = hetero.Session(model, backends=["rknn", "cpu"], on_fallback="silent").run({"x": x})
    keys = {p.stem for p in rknn_cache.glob("*.json")}
    starts = worker("simulator").starts
    again = hetero.Session(model, backends=["rknn", "cpu"], on_fallback="silent").run({"x": x})
    np.testing.assert_array_equal(again["logits"], first["logits"])
    assert {p.stem for p in rknn_cache.glob("*.json")} == keys and worker("simulator").starts == starts
    other = hetero.Session(model, backends=["rknn", "cpu"], on_fallback="silent", options={"rknn_target": "rk3566"})
    np.testing.assert_allclose(other.run({"x": x})["logits"], first["logits"], atol=5e-3)
    rk3566 = {p.stem for p in rknn_cache.glob("*.json")} - keys
    assert len(rk3566) == 3 and {json.loads((rknn_cache / f"{k}.json").read_text())["target"] for k in rk3566} == \
        {"rk3566"}


def test_converter_abort_is_an_error_naming_segment_and_target(rknn_cache):
    """rknn-toolkit2 2.5.0 aborts (SIGABRT) converting this CNN to int8 for the rk2118: the user gets an error."""
    x = cnn.images(1)[0]
    with pytest.raises(BackendError) as info:
        hetero.Session(cnn.build(), backends=["rknn", "cpu"], options={
            "rknn_target": "rk2118", "rknn_dtype": "int8", "rknn_calibration": [{"x": x}],
        })
    message = str(info.value)
    assert message.startswith("the rknn worker died (killed by SIGABRT) while building segment 0 (3 nodes: "), message
    assert "for rk2118 (int8); the process using hetero is unharmed" in message
    assert "Meet unsupported conv" in message  # the toolkit's own last words
    assert type(info.value).__name__ == "WorkerCrashed"
    # the next session gets a new worker
    session = hetero.Session(cnn.build(), backends=["rknn", "cpu"], on_fallback="silent")
    assert session.run({"x": x})["logits"].shape == (1, cnn.CLASSES)


def test_a_killed_worker_is_replaced_and_the_model_rebuilt(rknn_cache):
    from hetero_rknn.factory import worker

    model = cnn.build()
    x = cnn.images(1)[0]
    session = hetero.Session(model, backends=["rknn", "cpu"], on_fallback="silent")
    before = session.run({"x": x})["logits"]
    process = worker("simulator").proc
    assert process is not None and process.poll() is None
    os.kill(process.pid, signal.SIGKILL)  # what an out-of-memory kill or a crash in another thread looks like
    process.wait()
    np.testing.assert_array_equal(session.run({"x": x})["logits"], before)


def test_real_model_silero_vad_splits_between_the_simulator_and_cpu(rknn_cache):
    """silero-vad (the static-shape 16 kHz export): its STFT magnitude and conv encoder run on the simulated NPU,
    the reflect padding, the 256-tap STFT conv, Gather, Cast and the LSTM on cpu."""
    from tests.real_models.models import MODELS

    model = MODELS["silero_vad_openvino_16k"]
    path = model.file()
    if path is None:
        pytest.skip(model.install_hint)
    session = hetero.Session(str(path), backends=["rknn", "cpu"], on_fallback="silent")
    text = session.explain()
    assert "LSTM        cpu" in text and "rknn: LSTM is not in the RKNN NPU's op list" in text
    assert sum(" FusedConv   rknn " in line for line in text.splitlines()) == 5
    reference = ort.InferenceSession(str(path))
    names = [o.name for o in reference.get_outputs()]
    feeds = model.feeds(model)
    state = feeds["state"]
    for _ in range(3):  # three consecutive 36 ms windows, the state carried as in streaming use
        feeds["state"] = state
        got = session.run(feeds)
        want = dict(zip(names, reference.run(None, feeds), strict=True))
        for name in names:
            np.testing.assert_allclose(got[name], want[name], atol=FLOAT_TOLERANCE * max(1.0, np.abs(want[name]).max()))
        state = want["stateN"]


def test_layout_only_segment_runs_on_the_host_and_replays(rknn_cache):
    """Erf (cpu) -> Unsqueeze (rknn: nothing for the NPU, so the numpy reference on the host, a view) -> Erf (cpu):
    the replay of the middle segment passes its view on to the next segment (runs 3 and 4 replay)."""
    from onnx import TensorProto, helper

    n = helper.make_node
    graph = helper.make_graph(
        [n("Erf", ["x"], ["a"]), n("Unsqueeze", ["a", "axes"], ["b"]), n("Erf", ["b"], ["y"])], "layout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0])])
    session = hetero.Session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                             backends=["rknn", "cpu"], on_fallback="silent")
    assert "Unsqueeze  rknn (numpy)  1" in session.explain()
    from math import erf

    for step in range(4):
        x = np.arange(4, dtype=np.float32) + step
        want = np.array([[erf(erf(v)) for v in x]], np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-6)
    assert not list(rknn_cache.glob("*.rknn"))  # nothing was built


def test_real_model_magika_with_a_static_batch(rknn_cache):
    """magika's content-type model with its batch dimension fixed to 1 (the NPU needs static shapes): most of it
    on the simulated NPU, its byte embedding (integer Gather, Cast) on cpu; the same label as onnxruntime."""
    from tests.real_models.models import MODELS

    model = MODELS["magika"]
    path = model.file()
    if path is None:
        pytest.skip(model.install_hint)
    proto = onnx.load(str(path))
    for value in [*proto.graph.input, *proto.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    session = hetero.Session(proto, backends=["rknn", "cpu"], on_fallback="silent")
    placed = [line.split()[2] for line in session.explain().splitlines()[2:] if len(line.split()) > 2]
    assert placed.count("rknn") > 3 * placed.count("cpu") > 0, placed
    reference = ort.InferenceSession(proto.SerializeToString())
    for row in model.feeds(model)["bytes"][:3]:
        feeds = {"bytes": row[None]}
        got, want = session.run(feeds)["target_label"], reference.run(["target_label"], feeds)[0]
        assert got.argmax() == want.argmax()
        np.testing.assert_allclose(got, want, atol=FLOAT_TOLERANCE)
