"""Real ONNX models from PyPI wheels, run through hetero and compared with onnxruntime."""
