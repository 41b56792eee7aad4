"""compute gateware."""
