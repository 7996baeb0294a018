"""``numcheck production`` (alias ``scale``): the production-shape tier from the command line."""
