"""A toy kind of implementation (a sum of a vector), registered as a new family would be (README.md beside it)."""
