"""MCF — memory- and communication-aware long-context LLM inference on KR260 FPGA nodes.

``mcf`` (this folder, ``sw/``) is the PS-side runtime: the ABI, MARS, metadata generation,
golden models, the PYNQ driver and the command line. It imports without Verilator or cocotb and
runs on the board's Python 3.10.
"""

__version__ = "0.1.0"
