"""``numcheck converge``: the tiny-model convergence run from the command line."""
