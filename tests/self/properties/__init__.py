"""Tests of the property library: tolerances, judgements, strategies, harness (numcheck.properties)."""
