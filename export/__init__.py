"""Offline export: HF / GGUF models -> static-shape ONNX graphs + manifest.json (imports torch)."""
