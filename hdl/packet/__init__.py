"""packet gateware."""
