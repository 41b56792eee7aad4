"""The two settings MARS is reported at: the paper's and the KR260 board's (``α``, ``S_node``).

``α`` (eq 15) and ``S_node`` (eq 10, the per-node KV budget) decide every replica factor, so
every plan takes them explicitly; a :class:`Setting` names a pair and says where it comes from.

* **paper** — ``α = 0.5``, ``S_node = 64 MiB``: the setting of the paper's evaluation as this
  project reads it (Table 1 at 16K: 112 MiB of INT4 KV in all, so 64 MiB forces convergence).
* **board** — ``α = 0.5`` and ``S_node`` = what a KR260 node's DDR holds after the model's
  weights: ``DDR − weights − reserve``. The DDR is the K26's 4 GiB of PS DDR4
  (/work/shared/design/platform.md); the weights are every linear and embedding weight in the
  compute core's INT4 format (``mcf.abi.quant.WEIGHT``) plus one scale per ``GROUP_SIZE``
  weights (``SCALE_MANT_BITS + SCALE_EXP_BITS`` bits, rounded up to bytes), replicated on every
  node; ``reserve`` is what the PS's Linux, PYNQ and the node's other DDR regions keep — an
  assumption (1 GiB by default), stated with every figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..abi.quant import GROUP_SIZE, SCALE_EXP_BITS, SCALE_MANT_BITS, WEIGHT
from .model import ModelSpec

__all__ = ["Setting", "PAPER_ALPHA", "PAPER_KV_BUDGET_MIB", "KR260_DDR_BYTES",
           "BOARD_RESERVE_MIB", "paper_setting", "board_setting", "weight_bytes", "SETTINGS",
           "get_setting"]

MIB = 2 ** 20

PAPER_ALPHA = 0.5
"""``α`` of the paper's evaluation (eq 15)."""
PAPER_KV_BUDGET_MIB = 64.0
"""``S_node`` of the paper's evaluation, MiB per node (eq 10)."""
KR260_DDR_BYTES = 4 * 2 ** 30
"""PS DDR4 of the K26 SOM on the KR260 (platform.md: 4 GB, 64-bit, 2400 MT/s)."""
BOARD_RESERVE_MIB = 1024.0
"""DDR the board keeps for Linux, PYNQ and the node's non-KV regions: an assumption."""


@dataclass(frozen=True)
class Setting:
    """``α`` and ``S_node`` with their provenance."""
    name: str
    alpha: float
    kv_budget_mib: float
    source: str

    def describe(self) -> str:
        return (f"{self.name} setting: alpha = {self.alpha:g}, S_node = "
                f"{self.kv_budget_mib:.1f} MiB ({self.source})")


def weight_bytes(model: ModelSpec) -> int:
    """Bytes of ``model``'s weights in the compute core's format: INT4 codes plus one scale
    per group of ``GROUP_SIZE``."""
    params = model.weight_params
    scale_bytes = -(-(SCALE_MANT_BITS + SCALE_EXP_BITS) // 8)
    return -(-params * WEIGHT.width // 8) + -(-params // GROUP_SIZE) * scale_bytes


def paper_setting() -> Setting:
    return Setting("paper", PAPER_ALPHA, PAPER_KV_BUDGET_MIB, "the paper's evaluation")


def board_setting(model: ModelSpec, ddr_bytes: int = KR260_DDR_BYTES,
                  reserve_mib: float = BOARD_RESERVE_MIB) -> Setting:
    """``S_node`` = the node's DDR after ``model``'s weights and ``reserve_mib``."""
    w = weight_bytes(model)
    free = ddr_bytes - w - reserve_mib * MIB
    if free <= 0:
        raise ValueError(f"{model.name}: {w / MIB:.0f} MiB of weights and {reserve_mib:g} MiB "
                         f"reserved leave no KV budget in {ddr_bytes / MIB:.0f} MiB of DDR")
    return Setting("board", PAPER_ALPHA, free / MIB,
                   f"KR260 DDR {ddr_bytes / MIB:.0f} MiB - {model.name} INT4 weights "
                   f"{w / MIB:.1f} MiB - reserve {reserve_mib:g} MiB")


SETTINGS = ("paper", "board")


def get_setting(name: str, model: ModelSpec) -> Setting:
    if name == "paper":
        return paper_setting()
    if name == "board":
        return board_setting(model)
    raise ValueError(f"unknown setting {name!r} (one of {', '.join(SETTINGS)})")
