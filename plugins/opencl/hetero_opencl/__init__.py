"""hetero-opencl: the OpenCL backend of hetero (OpenCL C kernels built at run time, cached per device and driver).

Installing this package registers the backend ``opencl`` in the entry-point group ``hetero.backends``; importing it
imports no native code (that happens when hetero probes or creates the backend).
"""

__version__ = "0.1.0"
