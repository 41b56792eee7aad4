"""cocotb module of the 10G XGMII MAC's bench (flat top ``eth_10g``): the tests of
:mod:`.eth_mac` for :data:`~.eth_mac.XGMII` (``XgmiiSink``/``XgmiiSource``, 156.25 MHz)."""

from .eth_mac import XGMII, cocotb_tests

lengths, bad, rate = cocotb_tests(XGMII, __name__)
