"""The linear + cross-entropy family: cases, strategies, tolerance, properties, the suite's table and known divergences."""
