"""Host side of one node top: its DDR layout, its configuration writes and the translation of
MARS's per-node records into the two command rings (docs/node.md §2–§5). Transport-free: the
PYNQ driver and the cocotb benches apply the same writes through their own buses."""
