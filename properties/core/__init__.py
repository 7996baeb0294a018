"""The machinery every family of the property library shares: comparisons, failures, runner, known-divergence
entries, records, profiles, draw isolation, poisoned memory, matmul precision."""
