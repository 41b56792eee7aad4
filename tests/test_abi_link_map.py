"""LINK_MAP ABI (mcf.abi.link_map, docs/node.md §9): the register, the crossbar's resolution
rule and the driver rule over clusters of 1..8 boards."""

from __future__ import annotations

import itertools

import pytest

from mcf.abi.csrmap import NODE_LINKS
from mcf.abi.link_map import (
    IDENTITY,
    LINK_MAP,
    LINK_MAP_STATUS,
    LINK_SFP,
    link_map_for,
    link_map_register,
    link_map_registers,
    link_map_routes,
    link_map_unpack,
    link_map_value,
)
from mcf.abi.nic import Topology
from mcf.abi.route import RingPort


def test_register_resets_to_identity_and_matches_the_layout():
    reg = link_map_register()
    assert [f.name for f in reg.fields] == [f"port{p}_link" for p in range(NODE_LINKS)]
    assert reg.reset == link_map_value(IDENTITY)
    assert link_map_unpack(reg.reset) == IDENTITY == (0, 1, 2)
    # the register's field offsets are the crossbar layout's
    for fld, off in reg.offsets():
        assert LINK_MAP[fld.name].offset == off and LINK_MAP[fld.name].shape.width == fld.width
    names = [r.name for r in link_map_registers()]
    assert names == ["LINK_MAP", *(f"link_map_{n}" for n, _ in LINK_MAP_STATUS)]
    for links in itertools.product(range(4), repeat=NODE_LINKS):
        assert link_map_unpack(link_map_value(links)) == links


def test_routes_lowest_port_wins_and_unmapped_links_drain():
    for perm in itertools.permutations(range(NODE_LINKS)):
        lop, pol = link_map_routes(perm)
        assert lop == perm and all(lop[pol[ln]] == ln for ln in range(NODE_LINKS))
    assert link_map_routes((1, 1, 0)) == ((1, None, 0), (2, 0, None))
    assert link_map_routes((3, 0, 0)) == ((None, 0, None), (1, None, None))
    assert link_map_routes((2, 2, 2)) == ((2, None, None), (None, None, 0))


def _ring_cables(n_nodes):
    """Each ring cable a → a+1 (mod N) as ((a, link at a), (b, link at b))."""
    maps = [link_map_for(n, n_nodes, "kr260-ring") for n in range(n_nodes)]
    return maps, [((a, maps[a][RingPort.NEXT]), ((a + 1) % n_nodes,
                                                maps[(a + 1) % n_nodes][RingPort.PREV]))
                  for a in range(n_nodes)]


@pytest.mark.parametrize("n_nodes", range(1, 9))
def test_ring_maps_wire_a_consistent_ring(n_nodes):
    maps, cables = _ring_cables(n_nodes)
    for n, mp in enumerate(maps):
        assert sorted(mp) == list(range(NODE_LINKS)), "a permutation: no port drained"
        assert mp == link_map_for(n, n_nodes, Topology.RING)
        # the table of docs/node.md §9
        if n % 2:
            assert mp[:2] == (1, LINK_SFP)
        elif n + 1 < n_nodes:
            assert mp[:2] == (LINK_SFP, 1)
        else:
            assert n_nodes % 2 and mp[:2] == (2, 1)
    for (a, la), (_b, lb) in cables:
        # SFP+ to SFP+ exactly on cables a <-> a+1 with a even and a+1 < N; RGMII elsewhere
        sfp = a % 2 == 0 and a + 1 < n_nodes
        assert (la == LINK_SFP) == sfp and (lb == LINK_SFP) == sfp, (n_nodes, a)
    # no (node, link) end carries two cables
    ends = [e for c in cables for e in c]
    assert len(ends) == len(set(ends)) == 2 * n_nodes


@pytest.mark.parametrize("n_nodes", range(1, 9))
def test_switch_maps_uplink_on_the_sfp(n_nodes):
    for n in range(n_nodes):
        mp = link_map_for(n, n_nodes, "kr260-switch")
        assert mp[0] == LINK_SFP and sorted(mp) == list(range(NODE_LINKS))
        assert mp == link_map_for(n, n_nodes, Topology.SWITCH) == IDENTITY


def test_link_map_for_rejects_what_it_cannot_wire():
    with pytest.raises(ValueError):
        link_map_for(0, 4, Topology.MESH)
    with pytest.raises(ValueError):
        link_map_for(0, 4, "torus")
    with pytest.raises(ValueError):
        link_map_for(4, 4, "ring")
