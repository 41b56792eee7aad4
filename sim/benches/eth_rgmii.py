"""cocotb module of the 1G RGMII MAC's bench (flat top ``eth_rgmii``): the tests of
:mod:`.eth_mac` for :data:`~.eth_mac.RGMII` (``RgmiiPhy``, 125 MHz DDR)."""

from .eth_mac import RGMII, cocotb_tests

lengths, bad, rate = cocotb_tests(RGMII, __name__)
