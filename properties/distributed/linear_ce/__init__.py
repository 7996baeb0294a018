"""Vocabulary-parallel linear+CE: cases, strategies, tolerance, properties, known divergences, the suite's runner."""
