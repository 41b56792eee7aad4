"""nic gateware: the network half of the compute-NIC (paper §3.2, §5) — router, reduction,
all-to-all, link framing, and a simulation link model. See docs/nic.md."""
