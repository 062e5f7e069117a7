"""Plugin discovery against throwaway installed distributions: broken, incompatible and unavailable plugins stay
status lines, discovery is lazy, HETERO_PLUGINS / HETERO_BACKENDS are obeyed, and the hooks extend hetero."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetero
from hetero import plugins
from hetero.contract import API_VERSION, registry
from hetero.runtime import selection
from hetero.testing.dist import Site, plugin_site

# Whether the cpu plugin worked before this module touched anything: then it must keep working.
CPU_OK = bool((row := plugins.status("cpu")) and row.ok)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with plugin_site(tmp_path) as s:
        yield s


def backend_module(name: str, *, api: str = "2.0", priority: int = 60, probe: str = "", factory_api: str = "") -> str:
    """Source of a plugin module with one host-memory table backend ``name``, whose Relu kernel counts its runs.

    ``probe``: the body of ``probe()`` (default: one device). ``factory_api``: a Factory.api_version override.
    """
    probe_body = probe or f'return [Device("{name}0")]'
    factory_line = f'api_version: ClassVar[str] = "{factory_api}"' if factory_api else "pass"
    return f'''
        from typing import ClassVar

        import numpy as np

        from hetero import BackendUnavailable
        from hetero.contract import Device, Factory, HostMemory, KernelTableBackend
        from hetero.contract import hookimpl

        api_version = "{api}"


        class CountingRelu:
            runs = 0

            def __init__(self, node, backend):
                pass

            def prepare(self, inputs, outputs):
                pass

            def run(self, inputs, outputs):
                type(self).runs += 1
                np.maximum(inputs[0].numpy(), 0, out=outputs[0].numpy())


        class TableBackend(HostMemory, KernelTableBackend):
            name: ClassVar[str] = "{name}"
            kernels: ClassVar = {{("", "Relu"): CountingRelu}}


        class TableFactory(Factory):
            name: ClassVar[str] = "{name}"
            priority: ClassVar[int] = {priority}
            {factory_line}

            def probe(self):
                {probe_body}

            def create(self, device, options=None):
                return TableBackend(device, options)


        @hookimpl
        def hetero_register_backends(register):
            register(TableFactory())
        '''


# A stand-in for a native extension: importing it leaves a file next to it, visible to this process and others.
NATIVE = """
    from pathlib import Path

    Path(__file__).with_name(__name__ + ".imported").write_text("imported")
"""


def relu_model() -> object:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


X = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], dtype=np.float32)


# -- plugins that fail in each way ---------------------------------------------------------------------------------
@dataclass
class Bad:
    modules: dict[str, str]
    status: str
    reason: list[str]  # fragments the reason must contain
    hint: list[str] = field(default_factory=list)
    native: str = ""  # a module that must never be imported


BAD: dict[str, Bad] = {
    "import raises": Bad(
        {"tplug_raises.py": "import json\nraise RuntimeError('libfoo.so.3: cannot open shared object file')\n"},
        plugins.BROKEN,
        ["import of tplug_raises failed", "RuntimeError", "libfoo.so.3", "tplug_raises.py:2"],
        ["pip install --force-reinstall hetero-tplug-raises"],
    ),
    "older api_version": Bad(
        {
            "tplug_older.py": backend_module("tplug_older", api="0.3", probe="import tplug_older_native"),
            "tplug_older_native.py": NATIVE,
        },
        plugins.INCOMPATIBLE,
        ["plugin API 0.3", hetero.API_VERSION],
        ["pip install -U hetero-tplug-older", "older hetero"],
        native="tplug_older_native",
    ),
    "newer api_version": Bad(
        {
            # A plugin for a future hetero: even its module-level code must not have pulled in native code.
            "tplug_newer.py": backend_module("tplug_newer", api="3.1", probe="import tplug_newer_native"),
            "tplug_newer_native.py": NATIVE,
        },
        plugins.INCOMPATIBLE,
        ["plugin API 3.1", hetero.API_VERSION],
        ["pip install -U hetero", f"hetero API {hetero.API_VERSION}"],
        native="tplug_newer_native",
    ),
    "factory api_version": Bad(
        {
            "tplug_factory.py": backend_module("tplug_factory", factory_api="3.0", probe="import tplug_factory_native"),
            "tplug_factory_native.py": NATIVE,
        },
        plugins.INCOMPATIBLE,
        ["factory tplug_factory targets plugin API 3.0"],
        ["pip install -U hetero, or a hetero-tplug-factory release"],
        native="tplug_factory_native",
    ),
    "factory older api_version": Bad(
        {
            # The module states the current API but its factory was written for the previous one.
            "tplug_oldfac.py": backend_module("tplug_oldfac", factory_api="1.0", probe="import tplug_oldfac_native"),
            "tplug_oldfac_native.py": NATIVE,
        },
        plugins.INCOMPATIBLE,
        ["factory tplug_oldfac targets plugin API 1.0", hetero.API_VERSION],
        ["pip install -U hetero-tplug-oldfac", "older hetero"],
        native="tplug_oldfac_native",
    ),
    "probe unavailable": Bad(
        {
            "tplug_ocl.py": backend_module(
                "tplug_ocl",
                probe='raise BackendUnavailable("OpenCL ICD loader libOpenCL.so.1 not found", '
                'hint="apt install ocl-icd-libopencl1, or your GPU vendor\'s OpenCL driver")',
            )
        },
        plugins.UNAVAILABLE,
        ["OpenCL ICD loader libOpenCL.so.1 not found"],
        ["apt install ocl-icd-libopencl1"],
    ),
    "probe raises": Bad(
        {"tplug_crash.py": backend_module("tplug_crash", probe='raise KeyError("device table")')},
        plugins.BROKEN,
        ["probe failed", "KeyError", "device table", "tplug_crash.py:"],
        ["report it to the authors of hetero-tplug-crash"],
    ),
    "SystemExit on import": Bad(
        {"tplug_exits.py": "import sys\nsys.exit(3)\n"},
        plugins.BROKEN,
        ["import of tplug_exits failed", "SystemExit: 3", "tplug_exits.py:2"],
    ),
}


def install_bad(site: Site, case: Bad) -> str:
    """Install the case's distribution; returns its backend (and entry point) name."""
    name = next(m for m in case.modules if not m.endswith("_native.py")).removesuffix(".py")
    site.add(f"hetero-{name.replace('_', '-')}", case.modules, {name: name})
    return name


# What a child process sees: the status table, and a session's output with automatic selection.
CHILD = """
import json, warnings
import numpy as np
from onnx import TensorProto, helper
import hetero

node = helper.make_node("Relu", ["x"], ["y"])
graph = helper.make_graph([node], "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    y = hetero.Session(model, on_fallback="silent").run({"x": x})["y"]
print(json.dumps({
    "rows": {r.name: [r.status, r.reason, r.hint] for r in hetero.backends()},
    "y": y.tolist(),
    "warnings": [str(w.message) for w in caught],
}))
"""


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_plugin_is_a_status_line(site: Site, kind: str) -> None:
    case = BAD[kind]
    name = install_bad(site, case)
    site.reload()

    row = plugins.status(name)
    assert row is not None, [r.name for r in plugins.statuses()]
    assert row.status == case.status, row
    for fragment in case.reason:
        assert fragment in row.reason, (fragment, row.reason)
    for fragment in case.hint:
        assert fragment in row.hint, (fragment, row.hint)
    assert row.distribution == f"hetero-{name.replace('_', '-')}" and row.version == "0.1"

    assert plugins.status("reference").ok
    if CPU_OK:
        assert plugins.status("cpu").ok
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # automatic selection warns that it skipped the bad one
        out = hetero.Session(relu_model(), on_fallback="silent").run({"x": X})["y"]
    np.testing.assert_array_equal(out, np.maximum(X, 0))
    if case.native:
        assert case.native not in sys.modules
        assert not (site.root / f"{case.native}.imported").exists()


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_plugin_in_a_fresh_process(site: Site, kind: str) -> None:
    case = BAD[kind]
    name = install_bad(site, case)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=site.subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["rows"][name][0] == case.status
    assert seen["rows"]["reference"][0] == plugins.OK
    if CPU_OK:
        assert seen["rows"]["cpu"][0] == plugins.OK
    assert seen["y"] == np.maximum(X, 0).tolist()
    assert [w for w in seen["warnings"] if name in w], seen["warnings"]  # skipped, with a reason, not a traceback
    if case.native:
        assert not (site.root / f"{case.native}.imported").exists()


# -- laziness --------------------------------------------------------------------------------------------------------
LAZY_CHILD = """
import sys
import hetero
loaded_early = [m for m in ("tplug_lazy", "hetero.reference") if m in sys.modules]
assert not loaded_early, f"import hetero loaded plugin modules: {loaded_early}"
rows = {r.name: r.status for r in hetero.backends()}
assert rows.get("tplug_lazy") == "ok" and rows.get("reference") == "ok", rows
assert "tplug_lazy" in sys.modules and "hetero.reference" in sys.modules
print("lazy ok")
"""


def test_import_hetero_loads_no_plugin(site: Site) -> None:
    site.add("hetero-tplug-lazy", {"tplug_lazy.py": backend_module("tplug_lazy")}, {"tplug_lazy": "tplug_lazy"})
    proc = subprocess.run([sys.executable, "-c", LAZY_CHILD], env=site.subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "lazy ok" in proc.stdout


# -- HETERO_PLUGINS and HETERO_BACKENDS --------------------------------------------------------------------------
def install_pair(site: Site) -> None:
    site.add("hetero-talpha", {"talpha.py": backend_module("talpha", priority=60)}, {"talpha": "talpha"})
    site.add("hetero-tbeta", {"tbeta.py": backend_module("tbeta", priority=30)}, {"tbeta": "tbeta"})


def relu_sigmoid_model() -> object:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes, "relu_sigmoid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.skipif(not CPU_OK, reason="the hetero-cpu plugin is not installed or does not work here")
def test_a_fallback_is_what_the_user_did_not_ask_for_not_a_lower_priority(site: Site) -> None:
    # A third-party backend asked before cpu (priority 10 < 50) that runs Relu alone: naming no backend asks for
    # every working one, so Sigmoid on cpu is no fallback; naming it alone makes cpu a fallback.
    site.add("hetero-tfirst", {"tfirst.py": backend_module("tfirst", priority=10)}, {"tfirst": "tfirst"})
    site.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error", hetero.HeteroWarning)
        automatic = hetero.Session(relu_sigmoid_model())
    assert [(p.backend, p.fallback) for p in automatic.placement.nodes] == [("tfirst", False), ("cpu", False)]
    with pytest.warns(hetero.HeteroWarning, match="1/2 nodes on cpu: Sigmoid"):
        named = hetero.Session(relu_sigmoid_model(), backends=["tfirst"])
    assert [(p.backend, p.fallback) for p in named.placement.nodes] == [("tfirst", False), ("cpu", True)]
    site.setenv("HETERO_BACKENDS", "tfirst")  # the variable is a request too
    with pytest.warns(hetero.HeteroWarning, match="1/2 nodes on cpu: Sigmoid"):
        hetero.Session(relu_sigmoid_model())


def test_allowlist_disables_the_others(site: Site) -> None:
    install_pair(site)
    site.setenv("HETERO_PLUGINS", "talpha")
    site.reload()
    assert plugins.status("talpha").ok
    beta = plugins.status("tbeta")
    assert beta.status == plugins.DISABLED and "HETERO_PLUGINS" in beta.reason
    assert "tbeta" not in sys.modules  # a disabled plugin is not even imported
    assert plugins.status("reference").ok  # the core plugin ends every chain, allowlist or not
    with pytest.raises(hetero.BackendUnavailable, match="tbeta: disabled"):
        hetero.Session(relu_model(), backends=["tbeta"])


def names(session: hetero.Session, among: set[str]) -> list[str]:
    return [b.name for b in session.backends if b.name in among]


def test_backend_order_from_priority_and_from_hetero_backends(site: Site) -> None:
    install_pair(site)
    site.reload()
    ours = {"talpha", "tbeta", "reference"}
    automatic = hetero.Session(relu_model(), on_fallback="silent")
    assert names(automatic, ours) == ["tbeta", "talpha", "reference"]  # priority 30 < 60 < 100
    assert automatic.placement.nodes[0].backend == "tbeta", automatic.placement.nodes[0]

    site.setenv("HETERO_BACKENDS", "talpha,tbeta")
    ordered = hetero.Session(relu_model(), on_fallback="silent")
    assert names(ordered, ours) == ["talpha", "tbeta", "reference"]
    assert ordered.placement.nodes[0].backend == "talpha"

    # a preference list: a missing backend is skipped with a warning (onnxruntime's habit), the next one used
    site.setenv("HETERO_BACKENDS", "tgamma,talpha")
    with pytest.warns(hetero.HeteroWarning, match="tgamma: not installed"):
        preferred = hetero.Session(relu_model(), on_fallback="silent")
    assert preferred.placement.nodes[0].backend == "talpha"
    site.setenv("HETERO_BACKENDS", "tgamma")  # the only one asked for: an error
    with pytest.raises(hetero.BackendUnavailable, match="tgamma: not installed"):
        hetero.Session(relu_model())


# -- explicit vs automatic selection of an unavailable backend -----------------------------------------------------
def test_explicit_unavailable_backend_raises_with_the_reason(site: Site) -> None:
    install_bad(site, BAD["probe unavailable"])
    site.reload()
    with pytest.raises(hetero.BackendUnavailable) as info:
        hetero.Session(relu_model(), backends=["tplug_ocl"])
    message = str(info.value)
    assert "tplug_ocl: unavailable: OpenCL ICD loader libOpenCL.so.1 not found" in message
    assert "apt install ocl-icd-libopencl1" in message


def test_unavailable_backend_in_a_preference_list_warns_once_and_uses_the_next(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    install_bad(site, BAD["probe unavailable"])
    site.reload()
    monkeypatch.setattr(selection, "_warned_skips", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            session = hetero.Session(relu_model(), backends="tplug_ocl,reference")  # a string, split like -b
            assert session.get_providers() == ["reference"]
    skipped = [w for w in caught if "tplug_ocl" in str(w.message)]
    assert len(skipped) == 1 and "libOpenCL.so.1 not found" in str(skipped[0].message)


def test_automatic_selection_skips_it_with_one_warning(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    install_bad(site, BAD["probe unavailable"])
    site.reload()
    monkeypatch.setattr(selection, "_warned_skips", set())  # "once per process": start this process afresh
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count hetero's own deduplication, not the warnings module's
        for _ in range(3):
            session = hetero.Session(relu_model(), on_fallback="silent")
            np.testing.assert_array_equal(session.run({"x": X})["y"], np.maximum(X, 0))
    about = [str(w.message) for w in caught if "tplug_ocl" in str(w.message)]
    assert len(about) == 1, about
    assert "unavailable" in about[0] and "libOpenCL.so.1" in about[0]
    assert issubclass(next(w.category for w in caught if "tplug_ocl" in str(w.message)), hetero.HeteroWarning)


def test_backend_whose_create_fails(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    source = backend_module("tplug_create", priority=5).replace(
        "return TableBackend(device, options)", "raise ModuleNotFoundError('hetero_tplug_create._native')")
    site.add("hetero-tplug-create", {"tplug_create.py": source}, {"tplug_create": "tplug_create"})
    site.reload()
    with pytest.raises(hetero.BackendUnavailable, match=r"tplug_create: create\(\) failed: ModuleNotFoundError"):
        hetero.Session(relu_model(), backends=["tplug_create"])
    monkeypatch.setattr(selection, "_warned_skips", set())
    with pytest.warns(hetero.HeteroWarning, match=r"backend skipped \(tplug_create: create\(\) failed"):
        session = hetero.Session(relu_model(), on_fallback="silent")  # automatic: skipped, the rest runs
    np.testing.assert_array_equal(session.run({"x": X})["y"], np.maximum(X, 0))


# -- hooks ---------------------------------------------------------------------------------------------------------
KERNEL_PLUGIN = """
    import numpy as np

    from hetero.contract import hookimpl

    api_version = "2.0"


    class TableSigmoid:
        runs = 0

        def __init__(self, node, backend):
            pass

        def prepare(self, inputs, outputs):
            pass

        def run(self, inputs, outputs):
            type(self).runs += 1
            x = inputs[0].numpy()
            np.divide(1.0, 1.0 + np.exp(-x), out=outputs[0].numpy())


    @hookimpl
    def hetero_register_kernels(register):
        register("ttable", "", "Sigmoid", TableSigmoid)
"""


def sigmoid_model() -> object:
    model = relu_model()
    model.graph.node[0].op_type = "Sigmoid"
    return model


def test_register_kernels_hook_extends_a_table_backend(site: Site) -> None:
    site.add("hetero-ttable", {"ttable.py": backend_module("ttable")}, {"ttable": "ttable"})
    site.reload()
    with pytest.raises(hetero.FallbackError, match="no ttable kernel for Sigmoid"):
        hetero.Session(sigmoid_model(), backends=["ttable"], on_fallback="error")

    site.add("hetero-tkernels", {"tkernels.py": KERNEL_PLUGIN}, {"tkernels": "tkernels"})
    site.reload()
    row = plugins.status("tkernels")
    assert row.ok and "kernels" in row.reason  # a plugin that only adds kernels is a working plugin
    session = hetero.Session(sigmoid_model(), backends=["ttable"], on_fallback="error")
    assert session.placement.nodes[0].backend == "ttable"
    out = session.run({"x": X})["y"]
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-X)), rtol=1e-6)
    assert sys.modules["tkernels"].TableSigmoid.runs == 1


OPS_PLUGIN = """
    import numpy as np

    from hetero.contract import hookimpl
    from hetero.contract.registry import OpSchema

    api_version = "2.0"


    def infer(ctx):
        return [ctx.inputs[0]]


    def reference(ctx):
        return [ctx.values[0] * 2]


    @hookimpl
    def hetero_register_ops(register):
        register(OpSchema("Twice", infer, reference, domain="com.example.tops"))
"""


def twice_model() -> object:
    node = helper.make_node("Twice", ["x"], ["y"], domain="com.example.tops")
    graph = helper.make_graph(
        [node], "twice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example.tops", 1)]
    )


# A fresh process: the op registry does not start discovery, loading a model does.
LOAD_CHILD = """
import sys
import hetero
from hetero.contract import registry
assert registry.find("com.example.tops", "Twice") is None and "tops" not in sys.modules
graph = hetero.load(sys.stdin.buffer.read())
print("loaded", [n.op_type for n in graph.nodes])
"""


def test_loading_a_model_discovers_the_ops_plugins_add(site: Site) -> None:
    site.add("hetero-tops", {"tops.py": OPS_PLUGIN}, {"tops": "tops"})
    proc = subprocess.run([sys.executable, "-c", LOAD_CHILD], input=twice_model().SerializeToString(),
                          env=site.subprocess_env(), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"loaded ['Twice']" in proc.stdout


def test_register_ops_hook_adds_an_op_models_can_use(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_SCHEMAS", dict(registry._SCHEMAS))  # forget the op after this test
    site.add("hetero-tops", {"tops.py": OPS_PLUGIN}, {"tops": "tops"})
    site.reload()
    model = twice_model()
    session = hetero.Session(model, backends=["reference"], on_fallback="error")
    np.testing.assert_array_equal(session.run({"x": X})["y"], X * 2)


def test_the_in_repo_plugins_state_their_own_api_version(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handshake can fail for them too: their version is a number they wrote down, not the core's."""
    installed = [r.name for r in plugins.statuses() if r.name in ("cpu", "opencl")]
    if not installed:
        pytest.skip("neither the cpu nor the opencl plugin is installed")
    monkeypatch.setattr(plugins, "API_VERSION", "3.0")  # a hetero one major version ahead of them
    site.reload()
    for name in installed:
        row = plugins.status(name)
        assert row.status == plugins.INCOMPATIBLE, (name, row.status, row.reason)
        assert f"plugin API {API_VERSION} does not match hetero's 3.0" in row.reason


def test_newer_factory_api_hint_says_upgrade_hetero(site: Site) -> None:
    install_bad(site, BAD["factory api_version"])
    site.reload()
    assert "pip install -U hetero," in plugins.status("tplug_factory").hint


def test_a_plugin_cannot_take_the_name_of_another_backend(site: Site) -> None:
    site.add("hetero-timpostor", {"timpostor.py": backend_module("reference")}, {"timpostor": "timpostor"})
    site.reload()
    impostor = next(r for r in plugins.statuses() if r.plugin == "timpostor")
    assert impostor.status == plugins.BROKEN and "already" in impostor.reason
    session = hetero.Session(relu_model(), backends=["reference"], on_fallback="silent")
    assert type(session.backends[0]).__module__ == "hetero.reference"
