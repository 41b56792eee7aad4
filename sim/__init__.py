"""Simulation side of MCF (``sim/`` → ``mcf.sim``): the Verilator/cocotb bootstrap
(:mod:`mcf.sim.toolchain`), the cocotb benches (``benches/``), and — as they land — the simulated
PYNQ device, the N-node cluster harness and the system-level performance model."""

from .toolchain import Built, ToolchainError, bench_params, build, run, verilator_env

__all__ = ["Built", "ToolchainError", "bench_params", "build", "run", "verilator_env"]
