"""hetero-metal: the Metal backend of hetero (Metal Shading Language kernels for Apple GPUs).

On macOS the kernels run on the GPU through the host module ``_metal`` (metal-cpp). Everywhere, the same ``.metal``
sources also run in a CPU emulator of Metal's compute model (``HETERO_METAL_EMULATE=1``), which is how they are
checked on Linux. Importing this package loads no native code.
"""

__version__ = "0.1.0"
