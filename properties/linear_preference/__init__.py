"""The linear+preference family's properties: its case, draws, bounds, properties and suite."""
