"""The FastRPC host side without a Snapdragon: what a user sees where libcdsprpc.so is absent, the scalars word of
remote.h, and the DSP-side library it would load (built with clang's Hexagon target)."""

from __future__ import annotations

import ctypes.util

import pytest

from hetero.contract.errors import BackendUnavailable

fastrpc = pytest.importorskip("hetero_hexagon.fastrpc")
hvx_qemu = pytest.importorskip("hetero_hexagon.hvx_qemu")


def test_scalars_word_follows_remote_h():
    # REMOTE_SCALARS_MAKE(3, 4, 3): method in bits 24-28, input buffers in 16-23, output buffers in 8-15
    assert fastrpc.scalars(3, 4, 3) == 0x03040300
    assert fastrpc.scalars(31, 255, 255) == 0x1FFFFF00


@pytest.mark.skipif(ctypes.util.find_library("cdsprpc") is not None, reason="libcdsprpc.so is installed here")
def test_without_libcdsprpc_the_transport_is_unavailable_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv(fastrpc.LIBRARY_ENV, str(tmp_path / "libcdsprpc.so"))
    with pytest.raises(BackendUnavailable, match=r"no FastRPC: libcdsprpc\.so not found") as info:
        fastrpc.FastRpcTransport()
    assert fastrpc.LIBRARY_ENV in info.value.hint and "qemu-hexagon" in info.value.hint


def test_the_skel_builds_as_a_hexagon_shared_object(tmp_path):
    try:
        toolchain = hvx_qemu.find_toolchain()
    except BackendUnavailable as e:
        pytest.skip(e.message)
    skel = fastrpc.build_skel(toolchain, tmp_path)
    data = skel.read_bytes()
    assert data[:4] == b"\x7fELF" and data[16] == 3  # ET_DYN
    assert int.from_bytes(data[18:20], "little") == 164  # EM_QDSP6 (Hexagon)
    assert fastrpc.SKEL_SYMBOL.encode() + b"\0" in data  # exported for the URI's symbol
