"""hetero-rknn: Rockchip NPUs (RK3588, RK3576, RK3568, RK3566, RK3562) for hetero.

The backend claims the largest runs of nodes the RKNN compiler takes, exports each as an ONNX model and builds it
with Rockchip's ``rknn-toolkit2`` (float16, or int8 with a calibration set), caching the built ``.rknn`` by content.
On a PC the toolkit's simulator runs them; on a board the on-board runtime (``rknn-toolkit-lite2``). The toolkit
pins old numpy / onnx / torch, so it lives in a venv of its own (``python -m hetero_rknn setup``) and runs in a worker
process: a converter that aborts is a ``HeteroError``, never the end of the user's process. See docs/npu.md.
"""

__version__ = "0.1.0"
