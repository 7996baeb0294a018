"""Helpers of numcheck's own tests: mutants (deliberately broken impls) and the impls and functions the tests declare."""
