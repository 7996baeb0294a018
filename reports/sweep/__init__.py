"""``numcheck sweep``: the property suite over several hypothesis seeds."""
