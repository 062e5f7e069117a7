"""hetero-cpu: the CPU backend of hetero, with native kernels (AVX-512 / AVX2+FMA / NEON, chosen at run time).

Installing this package registers the backend ``cpu`` in the entry-point group ``hetero.backends``; importing it
imports no native code (that happens when hetero probes or creates the backend).
"""

__version__ = "0.1.0"
