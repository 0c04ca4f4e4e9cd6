"""Backends behind one small protocol: ONNX Runtime and a fake table-driven engine."""
