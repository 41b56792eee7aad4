"""Traffic generators shared by the NIC tests and benches (no cocotb): router route tables and
multicast packets with malformed ones mixed in; reduction contributions in random arrival order
with interleaved tags and malformed ones mixed in."""

from __future__ import annotations

import itertools
import random

import numpy as np

from mcf.abi.meta import Collective, Meta, Op, ReduceOp, Stage
from mcf.abi.route import NET_PORTS, route_entry
from mcf.abi.softmax import EXP_FRAC, M_EMPTY, STATE_L, STATE_O, pack_state
from mcf.golden.nic import Packet, RouterModel

K_OF_ROUTE = {0: 1, 1: 2, 2: 3, 3: 4, 4: 8}


def router_table(n_ports: int) -> dict[int, int]:
    """Route ids → entries: every non-empty subset of the ports (local bit alternating), local
    only, no route, and — when the router has fewer than NET_PORTS ports — a port it lacks."""
    table, rid = {}, 0
    for size in range(1, n_ports + 1):
        for ports in itertools.combinations(range(n_ports), size):
            table[rid] = route_entry(set(ports), local=bool(rid % 2))
            rid += 1
    table[rid] = route_entry(set(), local=True)
    table[rid + 1] = 0
    if n_ports < NET_PORTS:
        table[rid + 2] = route_entry({n_ports}, local=False)
    return table


def router_traffic(rng: random.Random, n_inputs: int, model: RouterModel, n_packets: int,
                   bpb: int, oversize: float = 0.03):
    """Random multicast packets over the routes ``model`` holds; input ``i`` sends with
    ``src = i``. Lengths: empty, 1 byte, around the beat, the maximum, random; a fraction
    ``oversize`` is longer than the maximum. Returns (packets per input, expected copies per
    output — network port number or ``"local"`` — and per input, in order)."""
    maxp = model.max_payload
    routes = sorted(model.table)
    sends = [[] for _ in range(n_inputs)]
    expected = {o: {i: [] for i in range(n_inputs)} for o in [*range(model.n_ports), "local"]}
    for uid in range(n_packets):
        i = rng.randrange(n_inputs)
        length = rng.choice([0, 1, bpb, bpb + 1, 2 * bpb, 4 * bpb, maxp, rng.randrange(maxp + 1)])
        if rng.random() < oversize:                   # malformed: longer than the maximum
            length = maxp + rng.randrange(1, 2 * bpb)
        meta = Meta(op=Op.KV_REPLICA, collective=Collective.MULTICAST, src=i,
                    route_id=rng.choice(routes), kv_id=uid & 0xFFFF, length=length)
        pkt = Packet(meta, rng.randbytes(length))
        dest = model.route(meta)
        if isinstance(dest, list):
            for d in dest:
                expected[d][i].append(pkt)
        sends[i].append(pkt)
    return sends, expected


def rand_state(rng: np.random.Generator, head_dim: int) -> bytes:
    kind = rng.integers(0, 10)
    if kind == 0:
        return pack_state(M_EMPTY, 0, np.zeros(head_dim, dtype=np.int64))
    if kind == 1:   # extremes: saturation of l and o
        return pack_state(rng.integers(-50, 50), STATE_L.max_int - rng.integers(0, 1 << 20),
                          rng.choice([STATE_O.min_int, STATE_O.max_int], head_dim))
    m = rng.integers(-(20 << 8), 20 << 8)
    l_sum = rng.integers(1 << EXP_FRAC, 64 << EXP_FRAC)
    o = rng.integers(-(8 << EXP_FRAC), 8 << EXP_FRAC, head_dim)
    return pack_state(m, l_sum, o)


def contribution(rng, tag, route_id, op, length, src):
    if op == ReduceOp.SOFTMAX_MERGE:
        payload = rand_state(rng, length // 4 - 2)
    else:
        payload = rng.integers(-(1 << 31), 1 << 31, length // 4).astype("<i4").tobytes()
    meta = Meta(stage=Stage.DECODE, op=Op.PARTIAL_STATE, collective=Collective.ALL_REDUCE,
                reduce_op=op, src=src, route_id=route_id, kv_id=tag, seq=tag & 0xFF,
                length=length)
    return meta, payload


def make_stream(seed, n_tags, window, malformed=0.1):
    rng = np.random.default_rng(seed)
    pending = []      # open tags: list of lists of contributions
    out = []
    tag = 1
    while tag <= n_tags or pending:
        if tag <= n_tags and len(pending) < window:
            rid = int(rng.choice(list(K_OF_ROUTE)))
            op = ReduceOp(int(rng.integers(1, 4)))
            words = int(rng.integers(2, 17)) if op == ReduceOp.SOFTMAX_MERGE else \
                int(rng.integers(1, 17))
            contribs = [contribution(rng, tag, rid, op, 4 * words, s)
                        for s in range(K_OF_ROUTE[rid])]
            pending.append(contribs)
            tag += 1
            continue
        j = int(rng.integers(0, len(pending)))
        out.append(pending[j].pop(0))
        still_open = bool(pending[j])
        if not pending[j]:
            pending.pop(j)
        if rng.random() < malformed:
            meta, payload = out[-1]
            kind = int(rng.integers(0, 4))
            if kind == 0:
                bad = meta.replace(length=6)
                out.append((bad, bytes(6)))
            elif kind == 1:
                out.append((meta.replace(reduce_op=ReduceOp.NONE), payload))
            elif kind == 2:
                out.append((meta.replace(route_id=9), payload))
            elif still_open:    # same open tag, different length: MISMATCH
                out.append((meta.replace(length=meta.length + 8), payload + bytes(8)))
    return out
