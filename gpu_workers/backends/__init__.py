"""Backends: ONNX Runtime, PyTorch, TensorRT and Python models behind one protocol."""
