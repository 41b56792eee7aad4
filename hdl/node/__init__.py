"""The node top's own components (paper §5, Fig. 2; design in ``docs/node.md``): metadata
ingress from the command rings, the landing engine, the sequencer and the node top itself."""
