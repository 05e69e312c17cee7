"""Surface request validation into plain typed objects; no I/O, no model access."""
