"""The target device's capacities: the programmable logic of the Kria K26 SOM on the KR260
(XCK26-SFVC784-2LV-C, Zynq UltraScale+). Resource estimates (:mod:`mcf.sim.synth`), the MARS
cost model's compute peak and the node's sizing all read this one table.

``LUT`` counts logic and LUT-RAM/SRL LUTs together (the estimates report LUT-RAM separately and
add it when they compute utilisation); ``BRAM36`` counts 36 Kb block RAMs (a RAMB18 is half).
"""

from __future__ import annotations

__all__ = ["K26", "HP_PORTS"]

K26: dict[str, int] = {"LUT": 117_120, "FF": 234_240, "DSP": 1_248, "BRAM36": 144, "URAM": 64}

HP_PORTS = 4
"""The PS's high-performance AXI slave ports the PL's DMA masters use (S_AXI_HP0..3_FPD,
128 bits each): one DMA loader per port."""
