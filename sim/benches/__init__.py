"""cocotb benches (test modules run inside the simulator by mcf.sim.toolchain.run)."""
