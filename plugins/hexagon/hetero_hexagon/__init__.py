"""hetero-hexagon: Qualcomm Hexagon for hetero (the HTP through QNN, and HVX kernels for the decode step)."""
