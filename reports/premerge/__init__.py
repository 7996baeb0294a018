"""``numcheck premerge``: the checklist, and its A/B mode with claims."""
