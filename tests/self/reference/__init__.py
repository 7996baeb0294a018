"""Tests of the float64 oracles (numcheck.reference)."""
