"""Ethernet MACs for the KR260's PL links (issue #13, ``docs/eth.md``): encapsulation of link
frames (:mod:`.encap`) and the 1G RGMII MAC (:mod:`.rgmii`)."""
