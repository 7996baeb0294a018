"""The production-shape tier: every linear+CE impl at the shapes users train at, judged against the float64 oracle."""
