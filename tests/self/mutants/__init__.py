"""The suite against mutants: every deliberately broken impl must be caught, every correct one must pass."""
