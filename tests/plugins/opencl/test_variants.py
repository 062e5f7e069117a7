"""fp16 and subgroup kernel variants: chosen from the extensions the device reports (never assumed), and the
results of the variants a device gets agree with the plain fp32 kernels on the same device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .conftest import needs_device

runtime = pytest.importorskip("hetero_opencl.runtime", reason="hetero-opencl is not installed")
Variants, kernel_variants = runtime.Variants, runtime.kernel_variants


@pytest.mark.parametrize("extensions,c_version,disabled,want", [
    ("cl_khr_icd cl_khr_fp64", "OpenCL C 1.2 pocl", (), Variants()),
    ("cl_khr_fp16", "OpenCL C 1.2", (), Variants(fp16=True)),
    ("cl_khr_fp16 cl_intel_subgroups cl_khr_subgroups", "OpenCL C 1.2", (), Variants(True, "intel")),
    ("cl_khr_subgroups", "OpenCL C 1.2", (), Variants()),  # khr subgroup builtins need OpenCL C 2.0
    ("cl_khr_subgroups", "OpenCL C 3.0 ", (), Variants(subgroups="khr", c_std="CL2.0")),
    ("cl_khr_fp16 cl_intel_subgroups", "OpenCL C 3.0", ("fp16", "subgroups"), Variants()),
])
def test_choice_follows_the_extensions(extensions, c_version, disabled, want):
    assert kernel_variants(extensions, c_version, disabled) == want


def test_defines_name_only_the_chosen_variants():
    assert Variants().defines() == []
    assert Variants(True, "intel").defines() == ["HAS_FP16=1", "HAS_SUBGROUPS=1", "HAS_INTEL_SUBGROUPS=1"]
    assert Variants(subgroups="khr", c_std="CL2.0").defines() == ["HAS_SUBGROUPS=1"]


# A tiny q4 decoder (quantization scales are half values, the KV cache is f16, RMSNorm / softmax / attention reduce
# over work-groups): every variant's code path runs. Prints the chosen variants, the build options and the logits.
SCRIPT = """
import json, numpy as np
from hetero.llm.synthetic import load_synthetic
llm = load_synthetic("tiny", "q4", backends=["opencl"], on_fallback="error", context=64, progress=False)
logits = [llm.prefill([1, 2, 3]).tolist(), llm.forward([4]).tolist()]
rt = llm.session.backends[0].rt
print(json.dumps({"variants": [rt.variants.fp16, rt.variants.subgroups, rt.variants.c_std],
                  "options": rt.options(()), "extensions": rt.info["extensions"],
                  "c_version": rt.info["opencl_c_version"], "logits": logits}))
"""


def _run(disable: str) -> dict:
    env = {**os.environ, "HETERO_OPENCL_DISABLE": disable}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_device
def test_device_variants_follow_its_extensions_and_match_the_plain_kernels():
    chosen, plain = _run(""), _run("fp16,subgroups")
    want = kernel_variants(chosen["extensions"], chosen["c_version"])
    assert tuple(chosen["variants"]) == (want.fp16, want.subgroups, want.c_std)
    assert ("-DHAS_FP16=1" in chosen["options"]) == ("cl_khr_fp16" in chosen["extensions"].split())
    assert ("-DHAS_SUBGROUPS=1" in chosen["options"]) == (want.subgroups is not None)
    assert tuple(plain["variants"]) == (False, None, "CL1.2") and "HAS_" not in plain["options"]
    # fp16 loads are exact and subgroup sums only reorder float additions: the logits agree to rounding.
    for got, ref in zip(chosen["logits"], plain["logits"], strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)


def _clang() -> str | None:
    """The newest clang of at least version 15: clang 14's OpenCL header does not declare cl_intel_subgroups'
    builtins for OpenCL C 1.2, so it refuses code that a device with the extension compiles."""
    import re
    import shutil

    for name in (*(f"clang-{v}" for v in range(20, 14, -1)), "clang"):
        if shutil.which(name):
            version = subprocess.run([name, "--version"], capture_output=True, text=True).stdout
            major = re.search(r"clang version (\d+)", version)
            if major and int(major[1]) >= 15:
                return name
    return None


@pytest.mark.skipif(_clang() is None, reason="no clang >= 15 to compile OpenCL C for a device with the extensions")
@pytest.mark.parametrize("std,defines,extensions", [
    ("CL1.2", Variants(True, "intel").defines(), "+cl_khr_fp16,+cl_intel_subgroups"),
    ("CL2.0", Variants(True, "khr", "CL2.0").defines(), "+cl_khr_fp16,+cl_khr_subgroups"),
])
def test_variant_sources_compile_for_a_device_with_the_extensions(std, defines, extensions, tmp_path):
    """This machine's device may lack the extensions, so its driver never builds the variants' code: clang builds
    every program (with the build defines that select its fp16 and subgroup paths) for SPIR with them instead."""
    from importlib import resources

    cl = resources.files("hetero_opencl").joinpath("cl")
    common = cl.joinpath("common.cl").read_text()
    extra = {"weights.cl": [["WFMT=1"], ["WFMT=5", "WBLOCK=32", "WBB=18", "WHDR=2"]], "llm.cl": [["KV_HALF=1"]]}
    for entry in cl.iterdir():
        if not entry.name.endswith(".cl") or entry.name == "common.cl":
            continue
        source = tmp_path / entry.name
        source.write_text(common + "\n" + entry.read_text())
        for more in extra.get(entry.name, [[]]):
            cmd = [_clang(), "-x", "cl", f"-cl-std={std}", "-target", "spir64", "-Xclang", "-finclude-default-header",
                   "-Xclang", f"-cl-ext={extensions}", "-fsyntax-only", *(f"-D{d}" for d in [*defines, *more]),
                   str(source)]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, f"{entry.name} {more}: {result.stderr[-2000:]}"
