"""Models and the runtimes that execute them (ONNX Runtime, TensorRT, torch CUDA)."""
