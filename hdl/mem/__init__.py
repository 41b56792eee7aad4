"""mem gateware."""
