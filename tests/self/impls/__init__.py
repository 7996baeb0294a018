"""Tests of the protocols, the registry and numcheck's own implementations (numcheck.impls)."""
