"""Bit-exact numpy golden models of the datapath blocks (one module per area)."""
