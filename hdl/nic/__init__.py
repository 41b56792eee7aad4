"""nic gateware."""
