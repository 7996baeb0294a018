"""numcheck's tests of itself (not shipped): the layering, the registry, the reports, the oracles."""
