"""Ethernet MACs for the KR260's PL links (issue #13, ``docs/eth.md``): encapsulation of link
frames (:mod:`.encap`), the 1G RGMII MAC (:mod:`.rgmii`), and the 10G SFP+ link — the 64-bit
XGMII MAC (:mod:`.xgmii`), the 10GBASE-R PCS (:mod:`.pcs10g`) and their wrappers
(:mod:`.tengig`: ``TenGigMac``, ``TenGigLink``)."""
