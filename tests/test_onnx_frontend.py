"""The ONNX front end: every way a model file can be wrong gives a HeteroError that names the problem."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetero
from conftest import make_model
from hetero.contract import HeteroError, ModelFormatError


def _relu_model():
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2, 3])],
                      [("y", TensorProto.FLOAT, [2, 3])])


def test_loads_path_bytes_and_proto(tmp_path):
    model = _relu_model()
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    for source in (model, model.SerializeToString(), path, str(path)):
        graph = hetero.load(source)
        assert [n.op_type for n in graph.nodes] == ["Relu"]
        assert graph.inputs == ["x"] and graph.outputs == ["y"]
        assert str(graph.values["x"]) == "float32[2x3]"


def test_symbolic_dims_are_unknown():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["batch", 3])],
                       [("y", TensorProto.FLOAT, ["batch", 3])])
    assert hetero.load(model).values["x"].shape == (None, 3)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(ModelFormatError, match=r"nope\.onnx"):
        hetero.load(tmp_path / "nope.onnx")


@pytest.mark.parametrize("group", [helper.make_attribute("group", "1"),
                                   helper.make_attribute("group", helper.make_graph([], "g", [], [])),
                                   helper.make_attribute("group", [1, 1])])
def test_an_attribute_of_another_type_than_onnx_declares_is_refused(group):
    """A Conv whose ``group`` is a string, a graph or a list (a fuzzed file: the byte of its type flipped) is refused
    by name at load, not left to crash a graph pass that reads it as an int."""
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv0")
    conv.attribute.append(group)
    model = make_model([conv], [("x", TensorProto.FLOAT, [1, 2, 5, 5])], [("y", TensorProto.FLOAT, None)],
                       [("w", np.ones((3, 2, 3, 3), np.float32))])
    kind = onnx.AttributeProto.AttributeType.Name(group.type)
    with pytest.raises(ModelFormatError, match=rf"'conv0' \(Conv\): attribute 'group' is {kind}; ONNX's schema "
                                               r"declares INT"):
        hetero.Session(model, backends=["reference"])


def test_garbage_file_is_a_format_error(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\xff\xfe this is not protobuf \x00\x01" * 10)
    with pytest.raises(ModelFormatError, match=r"garbage\.onnx"):
        hetero.load(path)


def test_truncated_file_is_a_format_error(tmp_path):
    model = _relu_model()
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match=r"cut\.onnx"):
        hetero.load(path)


def test_missing_initializer_names_the_value():
    model = make_model([helper.make_node("Add", ["x", "bias"], ["y"], name="add_bias")],
                       [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    with pytest.raises(ModelFormatError, match=r"'bias'.*neither a graph input, an initializer"):
        hetero.load(model)


def test_unknown_op_names_node_and_op():
    model = make_model([helper.make_node("FrobnicateTensor", ["x"], ["y"], name="frob", domain="com.example")],
                       [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(HeteroError, match=r"'frob'.*com\.example::FrobnicateTensor"):
        hetero.load(model)


def test_value_defined_twice():
    model = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
                       [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    with pytest.raises(ModelFormatError, match="'y' is defined twice"):
        hetero.load(model)


def test_graph_output_nobody_produces():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2])],
                       [("z", TensorProto.FLOAT, [2])])
    with pytest.raises(ModelFormatError, match="output 'z'"):
        hetero.load(model)


def _external_model(location: str, offset: int = 0, length: int | None = None):
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_external_data_inside_folder_is_read(tmp_path):
    weights = np.arange(4, dtype=np.float32)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8 + weights.tobytes())
    path = tmp_path / "m.onnx"
    onnx.save(_external_model("weights.bin", offset=8, length=16), path)
    graph = hetero.load(path)
    # read into memory, not mapped: a mapped file truncated under a live model would raise SIGBUS (issue 19)
    assert not isinstance(graph.initializers["w"], np.memmap)
    session = hetero.Session(path, backends=["reference"])
    (tmp_path / "weights.bin").write_bytes(b"")  # truncated after loading
    out = session.run({"x": np.ones(4, np.float32)})["y"]
    np.testing.assert_array_equal(out, weights + 1)


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "/etc/passwd"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    path = model_dir / "m.onnx"
    onnx.save(_external_model(location), path)
    with pytest.raises(ModelFormatError, match="outside the model's folder"):
        hetero.load(path)


def test_external_data_symlink_leaving_folder_is_refused(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    (model_dir / "link.bin").symlink_to(tmp_path / "secret.bin")
    path = model_dir / "m.onnx"
    onnx.save(_external_model("link.bin"), path)
    with pytest.raises(ModelFormatError, match="outside the model's folder"):
        hetero.load(path)


def test_external_data_too_short(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\0" * 10)
    path = tmp_path / "m.onnx"
    onnx.save(_external_model("w.bin"), path)
    with pytest.raises(ModelFormatError, match=r"initializer 'w'.*does not fit"):
        hetero.load(path)


def test_external_data_missing_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_external_model("absent.bin"), path)
    with pytest.raises(ModelFormatError, match=r"'absent\.bin' does not exist"):
        hetero.load(path)
