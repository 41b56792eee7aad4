"""Bit-exact numpy golden models, one module per block: the datapath blocks', the integer Qwen2
forward (:mod:`.model`), the node programs' (:mod:`.node_prefill`, :mod:`.node_decode`,
:mod:`.node_tp`) and the cluster run's (:mod:`.cluster`). They import :mod:`mcf.abi`, never
:mod:`mcf.hdl` or :mod:`mcf.sim` (``tests/test_layering.py``)."""
