"""The simulated KR260 (issue #12 item 2; docs/board.md "The simulated board"): the node top
under Verilator behind the real PYNQ API — :class:`SimBoard` (a ``pynq`` ``Device``), the
``.hwh`` of the block design (:mod:`.hwh`) and the link ports with a loopback cable
(:mod:`.links`). Importing :mod:`.device` or :mod:`.links` needs cocotb and PYNQ; :mod:`.hwh`
needs neither."""
