"""How a graph's linear weights are stored and multiplied: block quantization (quantize.py), the
quantized blocks a checkpoint brings (blocks.py: GGUF's types decoded), and the linears strategies
(linears.py: float / MatMulNBits; integer_linears.py: int8 x int8 rows; row_linears.py: the row kernel)."""
