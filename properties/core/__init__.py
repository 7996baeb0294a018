"""The linear+CE core of the property library, and the machinery every family shares: problems, strategies, harness, tolerance, accuracy, properties, failures, runner, coverage, profiles."""
