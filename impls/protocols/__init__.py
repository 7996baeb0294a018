"""The protocols users declare their implementations against, and the declaration machinery they share."""
