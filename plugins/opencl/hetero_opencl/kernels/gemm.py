"""The tiled GEMM (cl/gemm.cl) and its per-device tiling: the first product of each shape class on a device times
every tiling that fits the device's work-group limit on that product's own buffers, and the fastest is cached in
the device's tuning.json (per device and driver; HETERO_OPENCL_TUNE=0 skips measuring and takes the default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .common import up

if TYPE_CHECKING:
    from .common import ClKernel

PROGRAM = "gemm.cl"
TUNING_VERSION = "v1"  # bump when CONFIGS changes: cached choices are indices into it


@dataclass(frozen=True)
class GemmConfig:
    """A WGX x WGY work-group computing a (WGY * RY) x (WGX * RX) tile of C, K walked TK at a time."""

    wgx: int
    wgy: int
    rx: int
    ry: int
    tk: int

    @property
    def defines(self) -> tuple[str, ...]:
        return (f"WGX={self.wgx}", f"WGY={self.wgy}", f"RX={self.rx}", f"RY={self.ry}", f"TK={self.tk}")

    @property
    def threads(self) -> int:
        return self.wgx * self.wgy

    def __str__(self) -> str:
        return f"{self.wgx}x{self.wgy} items of {self.ry}x{self.rx}, k{self.tk}"


CONFIGS = (
    GemmConfig(8, 8, 4, 4, 16),  # 32x32 tiles: the default, a middle ground for GPUs and CPUs
    GemmConfig(16, 16, 2, 2, 16),  # 32x32 tiles, more work-items: GPUs with many lanes per compute unit
    GemmConfig(8, 8, 8, 8, 8),  # 64x64 tiles, 64 accumulators each: GPUs with large register files
    GemmConfig(16, 16, 4, 4, 8),  # 64x64 tiles, 256 work-items
    GemmConfig(4, 4, 4, 4, 16),  # 16x16 tiles, 16 work-items: CPU devices (a work-group is a loop there)
    GemmConfig(4, 4, 8, 8, 16),  # 32x32 tiles, 16 work-items of 64 accumulators: CPU devices, large products
)
DEFAULT = 0
MIN_TUNED_MACS = 1 << 22  # below this a product's time is mostly launch overhead: no basis for a choice


def shape_class(m: int, n: int, k: int) -> str:
    """Products that favour different tilings: few rows (prefill of a short prompt, a 1x1 conv on a small image)
    or a deep K against a small output, versus large square-ish ones."""
    if min(m, n) <= 32:
        return "skinny"
    return "deep" if k >= 4 * max(m, n) else "square"


def gemm_config(kernel: ClKernel, m: int, n: int, k: int, trial: Any) -> GemmConfig:
    """The tiling for this product's shape class on this device: tuned on the first product of the class big enough
    to time (``trial(config)`` enqueues one run of that real product with that tiling), then read from the cache.
    Smaller products before it take the default."""
    rt = kernel.rt
    usable = [i for i, c in enumerate(CONFIGS) if c.threads <= rt.max_wg]
    default = DEFAULT if DEFAULT in usable else usable[0]
    key = f"gemm/{TUNING_VERSION}/{shape_class(m, n, k)}"
    if m * n * k < MIN_TUNED_MACS and not rt.is_tuned(key):
        return CONFIGS[default]
    choice = rt.tuned(key, usable, lambda i: trial(CONFIGS[i]), default)
    return CONFIGS[choice if 0 <= choice < len(CONFIGS) else default]


def gemm(kernel: ClKernel, a, b, c, m: int, n: int, k: int, strides: tuple[int, int, int, int], offs,
         batch: int = 1, *, c_off: int = 0, alpha: float = 1.0, beta: float = 1.0, bias=None,
         bias_strides: tuple[int, int, int] = (0, 0, 0), act: tuple[int, float, float] = (0, 0.0, 0.0),
         config: GemmConfig | None = None) -> None:
    """C[b] = act(alpha * A[b] @ B[b] + beta * bias) through the tiled kernel (see cl/gemm.cl for the strides);
    ``config`` forces a tiling (tests), else the device's tuned one."""
    if m == 0 or n == 0 or batch == 0:
        return
    sam, sak, sbk, sbn = strides
    args = (a, b, c, kernel.be.dummy if bias is None else bias, offs, m, n, k, sam, sak, sbk, sbn, c_off,
            float(alpha), float(beta), int(bias is not None), *bias_strides, act[0], float(act[1]), float(act[2]))

    def launch(cfg: GemmConfig) -> None:
        tile_n, tile_m = cfg.wgx * cfg.rx, cfg.wgy * cfg.ry
        kernel.launch(kernel.k(PROGRAM, "gemm", cfg.defines), [up(n, tile_n) // cfg.rx, up(m, tile_m) // cfg.ry, batch],
                      [cfg.wgx, cfg.wgy, 1], *args)

    launch(config or gemm_config(kernel, m, n, k, launch))
