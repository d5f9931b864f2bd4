"""Reports: markdown tables and matplotlib figures of continual-learning results."""
