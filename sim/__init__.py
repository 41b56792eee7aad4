"""Simulation side of MCF (``sim/`` → ``mcf.sim``): the Verilator/cocotb bootstrap and runner
(:mod:`mcf.sim.toolchain`), the cocotb benches (``benches/``, imported by nothing outside it),
the helpers they share with tests and benchmarks (:mod:`mcf.sim.tb`, :mod:`mcf.sim.amsim`), the
measured benches of ``mcf bench`` (``perf/``), the simulated boards (``board/``) and cluster."""

from .toolchain import Built, ToolchainError, bench_params, build, run, verilator_env

__all__ = ["Built", "ToolchainError", "bench_params", "build", "run", "verilator_env"]
