"""``numcheck report``: the grid, the run, the schema, the comparison with a baseline, Markdown and plots."""
