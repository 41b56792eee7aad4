"""csr gateware."""
