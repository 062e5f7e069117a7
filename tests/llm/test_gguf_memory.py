"""A GGUF model is resident once, not twice: backends that repack quantized weights read the file's pages once, and
the loader drops those pages from the process (``GgufFile.release`` / ``hetero.llm.gguf.release``, madvise
MADV_DONTNEED) so that the map does not stay resident beside the repacked copies.

Memory is accounted from ``/proc/self/smaps``: the resident bytes of this process's mappings of one file. No timing,
no process-wide RSS (other tests' allocations would blur it)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import hetero
from hetero.llm import gguf
from hetero.llm.gguf import GgufFile

from .helpers import load

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "fixtures" / "gguf" / "qwen3-q8_0.gguf"
SMAPS = Path("/proc/self/smaps")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not SMAPS.is_file(),
                                reason="resident memory per mapping is read from Linux's /proc/self/smaps")


def resident(path: Path) -> int:
    """Bytes of ``path`` mapped into this process and resident (the sum over its mappings)."""
    target = str(path.resolve())
    total, inside = 0, False
    for line in SMAPS.read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's header line
            inside = len(head) == 6 and head[5] == target
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_release_drops_the_pages_under_an_array_and_keeps_its_data(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copyfile(COMMITTED, path)  # a file of its own: no other test's map of it is counted
    gf = GgufFile(path)
    name = max(gf, key=lambda n: gf[n].nbytes)
    array = gf.array(name)
    before = np.array(array)  # reading it makes all its pages resident
    touched = resident(path)
    assert touched >= array.nbytes
    dropped = gguf.release(array)
    assert array.nbytes - 2 * 4096 <= dropped <= array.nbytes  # the whole pages inside the tensor
    assert touched - resident(path) == dropped  # they were resident, now they are not; nothing else moved
    np.testing.assert_array_equal(array, before)  # the pages come back from the page cache
    assert gguf.release(before) == 0  # not a view of a GGUF map
    gf.release()
    assert resident(path) == 0


def test_releasing_block_leaves_nothing_resident(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copyfile(COMMITTED, path)
    gf = GgufFile(path)
    with gf.releasing(interval=0.001):
        total = sum(float(np.asarray(gf.array(n), dtype=np.float64).sum()) for n in gf)  # touches every tensor
    assert np.isfinite(total)
    assert resident(path) == 0
    gf.close()


def _cpu_available() -> bool:
    return any(s.name == "cpu" and s.status == "ok" for s in hetero.backends())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_a_loaded_model_does_not_keep_the_file_resident_beside_the_repacked_weights(tmp_path, qtype):
    """After ``load`` on the cpu backend (which repacks q8 / q4 blocks into its own layout) the file's pages are no
    longer resident in the process, and the model still computes what the numpy reference computes from the file."""
    pytest.importorskip("gguf", reason="the gguf package (GGUF writer) is absent")
    if not _cpu_available():
        pytest.skip("the cpu plugin is not available")
    from .helpers import gguf_writer

    w = gguf_writer()
    path = tmp_path / f"model-{qtype}.gguf"
    w.convert(w.write_random_folder(tmp_path / "src"), path, qtype)
    embedding = GgufFile(path)["token_embd.weight"].nbytes
    llm = load(path, backends=["cpu"], on_fallback="error")
    repacked = [n for n in llm.session.graph.nodes if n.op_type == "QMatMul"]
    assert repacked and all(n.attrs["wtype"] == qtype[0:2].lower() for n in repacked)
    size = path.stat().st_size
    assert resident(path) < 0.05 * size, f"{resident(path)} of {size} bytes of the file still resident after load"
    ids = [1, 7, 42, 3, 99]
    shutil.copyfile(path, tmp_path / "copy.gguf")  # the reference reads its own map, not counted with this one
    ref = load(tmp_path / "copy.gguf", backends=["reference"]).forward(ids)
    got = llm.forward(ids)
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()  # int8 activations on the cpu kernels
    # Running reads the embedding rows in place (with the kernel's fault-around, 64 KiB): nothing of the repacked
    # matrices comes back.
    assert resident(path) <= embedding + (64 << 10)
