"""The property library shared by the tests and the reports: problems, harness, tolerances, properties."""
