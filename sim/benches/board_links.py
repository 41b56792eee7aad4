"""cocotb bench of ``mcf deploy --check-links`` on simulated KR260s (run by
``tests/test_deploy_links.py``).

The build is :class:`mcf.sim.cluster.ClusterTop` (``node_cluster<N>``, the ring's cables as link
models); each node is a :class:`mcf.sim.board.SimBoard` on its ``n<i>_`` ports, bound through
``pynq.Overlay(<mcf_node_sim.hwh>, device=board)`` to :class:`mcf.driver.NodeDriver`. The host
code is the check's own (:class:`mcf.deploy.links.NodePing`, :func:`cable_verdicts`,
:func:`missing`) in one thread (cocotb ``bridge``), node by node in the order the SSH launcher
uses: every node prepared, then started from node N−1 down to node 0, then waited for.

Params: ``nodes``, ``hwh``, ``out`` (the JSON written: one entry per round), ``timeout``
(simulated seconds per node), ``rounds``: one check per entry, each after the overlays are
loaded again (a PL reset), the entry ``None`` or the directed cable ``k`` of
:func:`mcf.sim.cluster.directed_links` whose next frame gets one bit flipped, as a bad cable
would.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
from cocotb.task import bridge, resume
from cocotb.triggers import RisingEdge

from mcf.sim.toolchain import bench_params

PERIOD_NS = 10


@cocotb.test()
async def check_links(dut):
    import numpy as np

    from mcf.deploy.links import BUFFER_BYTES, NodePing, cable_verdicts, missing
    from mcf.sim.board.device import SimBoard
    from mcf.sim.cluster import directed_links

    params = bench_params()
    n = params["nodes"]
    for k in range(len(directed_links(n))):
        getattr(dut, f"link{k}_inject").value = 0
    boards = [SimBoard(dut, prefix=f"n{i}_", start_clock=i == 0, period_ns=PERIOD_NS,
                       mem_bytes=1 << 20, seed=i + 1) for i in range(n)]

    def load():
        from pynq import Overlay

        import mcf.driver  # noqa: F401 - registers NodeDriver with PYNQ
        return [Overlay(params["hwh"], device=b) for b in boards]   # each resets the PL

    async def flip(k: int) -> None:
        line = getattr(dut, f"link{k}_inject")
        await RisingEdge(dut.aclk)
        line.value = 1
        await RisingEdge(dut.aclk)
        line.value = 0

    rounds = []
    for broken in params["rounds"]:
        overlays = await bridge(load)()

        def host(overlays=overlays, broken=broken):
            from pynq import allocate
            pings = [NodePing(ol.node, v, n, allocate((BUFFER_BYTES,), dtype=np.uint8,
                                                       target=b))
                     for v, (ol, b) in enumerate(zip(overlays, boards))]
            for p in pings:
                p.prepare(ready_timeout=1e-3)
            if broken is not None:
                resume(flip)(broken)
            for p in reversed(pings):
                p.start()
            return [p.wait(params.get("timeout", 2e-4)) for p in pings]

        results = await bridge(host)()
        verdicts = cable_verdicts(results)
        rounds.append({
            "lines": [v.line() for v in verdicts], "ok": [v.ok for v in verdicts],
            "cables": [[list(v.a), list(v.b)] for v in verdicts], "stuck": missing(results),
            "results": [json.loads(r.to_json()) for r in results]})
    Path(params["out"]).write_text(json.dumps(rounds))
