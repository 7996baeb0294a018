"""The linear-distill family's properties: its case, draws, bounds, properties and suite."""
