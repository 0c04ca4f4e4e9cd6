"""Exporting the target model: its config, weights, graphs, quantization and validation."""
