"""The FP8 quantized-linear family: cases, strategies, tolerance, properties and the suite's table."""
