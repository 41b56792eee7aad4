"""Event-level system model of an N-node KR260 cluster running a MARS prefill (issue #15 §3)."""
