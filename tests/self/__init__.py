"""numcheck's own tests (not shipped in the wheel)."""
