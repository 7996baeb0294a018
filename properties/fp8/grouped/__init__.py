"""The grouped FP8 linear family (mixture-of-experts): cases, strategies, tolerance, properties and the suite's table."""
