"""The discrete-event simulation of one chunk step (cycles from the step's doorbell).

Actors:

* **Nodes** — each runs its COMPUTE queue in order, layer by layer: ``JOB 2l``, ``EMIT``, a wait
  until every message of layer ``l`` its ATTEND reads has landed (the block barriers),
  ``ATTEND``, ``JOB 2l+1`` (durations from :mod:`.rates`). The end of ``EMIT(l)`` releases the
  node's store-phase messages of layer ``l`` (the EMIT tee and the sends behind it).
* **Messages** — one per (MARS transfer, layer): the transfer's bytes of that layer, cut into
  its packets. Plan-phase (and hand-off) messages are on the NET queue at the doorbell,
  layer-major; a ring-streaming hop (``Transfer.chain``) leaves its relay as the previous hop's
  packets land (double-buffered: the relay forwards packet by packet, never the whole block).
* **Links** — every directed link is a server: one message at a time, FIFO within each queue
  class (NET, COMPUTE), alternating between the classes when both wait (the node's
  packet-granular arbiters, at message granularity). A message crosses a multicast tree hop by
  hop; the next hop may start once the first packet is across (store and forward per packet)
  and cannot finish before its last packet has arrived.

The step ends when every node has run its program and every message has landed (the RTL
bench's step: doorbell to the last landing).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Route", "Hop", "StepInput", "StepTimeline", "simulate_step", "NET", "COMPUTE"]

NET, COMPUTE = 0, 1


@dataclass(frozen=True)
class Hop:
    link: object
    parent: int            # index of the hop feeding it (-1: leaves the source)
    cycles: float          # all packets of one layer's message
    first: float           # its first packet
    last: float            # its last packet
    latency: float         # to the far end (cable + NIC)
    dest: int | None       # the node that keeps a copy at the far end, if any


@dataclass(frozen=True)
class Route:
    """How one transfer's per-layer message crosses the network."""
    src: int
    hops: tuple[Hop, ...]
    dests: tuple[int, ...]
    cls: int               # NET or COMPUTE
    trigger: str           # "start" | "emit" | "relay"
    successors: tuple[int, ...] = ()   # ring-streaming hops relayed from this one's dest
    needers: tuple[int, ...] | None = None   # dests whose ATTEND waits for it (None: all)


@dataclass(frozen=True)
class StepInput:
    nodes: int
    layers: int
    ops: tuple             # per node: (job_a, emit, attend, job_b) cycles of one layer
    routes: tuple[Route, ...]


@dataclass
class StepTimeline:
    cycles: float
    busy: list             # per node: cycles its COMPUTE queue ran
    finish: list           # per node: when its program ended
    waited: list           # per node: cycles it waited for landings
    last_landing: float
    messages: int
    link_busy: dict = field(default_factory=dict)   # link -> cycles carrying data

    @property
    def critical_busy(self) -> float:
        return max(self.busy, default=0.0)

    @property
    def exposed(self) -> float:
        """Cycles of the step the busiest node's compute does not cover."""
        return max(0.0, self.cycles - self.critical_busy)


class _Link:
    __slots__ = ("free", "queues", "turn", "busy")

    def __init__(self):
        self.free = True
        self.queues = (deque(), deque())
        self.turn = NET
        self.busy = 0.0


def simulate_step(inp: StepInput) -> StepTimeline:
    L, routes = inp.layers, inp.routes
    heap: list = []
    seq = 0

    def push(t, *ev):
        nonlocal seq
        heapq.heappush(heap, (t, seq, ev))
        seq += 1

    pending = [[0] * L for _ in range(inp.nodes)]
    emit_routes: list[list[int]] = [[] for _ in range(inp.nodes)]
    needs = {(r_i, d): r.needers is None or d in r.needers
             for r_i, r in enumerate(routes) for d in r.dests}
    children: list[list[list[int]]] = []
    for r_i, r in enumerate(routes):
        kids: list[list[int]] = [[] for _ in r.hops]
        for h_i, h in enumerate(r.hops):
            if h.parent >= 0:
                kids[h.parent].append(h_i)
        children.append(kids)
        for d in (r.dests if r.needers is None else r.needers):
            for lay in range(L):
                pending[d][lay] += 1
        if r.trigger == "emit":
            emit_routes[r.src].append(r_i)
    links: dict = {}
    root_hops = [tuple(h_i for h_i, h in enumerate(r.hops) if h.parent < 0) for r in routes]

    # plan-phase messages: on the NET queue at the doorbell, layer-major
    for lay in range(L):
        for r_i, r in enumerate(routes):
            if r.trigger == "start":
                for h_i in root_hops[r_i]:
                    push(0.0, "ready", r_i, lay, h_i, 0.0)

    def start(t, r_i, lay, h_i, min_end):
        h = routes[r_i].hops[h_i]
        lk = links[h.link]
        lk.free = False
        end = max(t + h.cycles, min_end)
        lk.busy += h.cycles
        push(end, "done", h.link)
        for c in children[r_i][h_i]:
            ch = routes[r_i].hops[c]
            push(t + h.first + h.latency, "ready", r_i, lay, c, end + h.latency + ch.last)
        if h.dest is not None:
            push(end + h.latency, "land", h.dest, lay, r_i)
            for s in routes[r_i].successors:
                for c in root_hops[s]:
                    ch = routes[s].hops[c]
                    push(t + h.first + h.latency, "ready", s, lay, c,
                         end + h.latency + ch.last)

    # nodes
    pc = [0] * inp.nodes
    busy = [0.0] * inp.nodes
    waited = [0.0] * inp.nodes
    finish = [0.0] * inp.nodes
    waiting: list = [None] * inp.nodes
    last_landing = 0.0

    def run(n, t):
        """Run node ``n`` from ``t`` up to its next wait (stage ``pc``: 3 per layer)."""
        a, e, _, _ = inp.ops[n]
        while pc[n] < 3 * L:
            lay, k = divmod(pc[n], 3)
            pc[n] += 1
            if k == 0:
                t += a
                busy[n] += a
            elif k == 1:
                t += e
                busy[n] += e
                for r_i in emit_routes[n]:
                    for h_i in root_hops[r_i]:
                        push(t, "ready", r_i, lay, h_i, 0.0)
            else:
                push(t, "wait", n, lay)
                return
        finish[n] = t

    def after_wait(n, t):
        """The layer's messages have landed: ATTEND and JOB 2l+1, then the next layers."""
        _, _, att, b = inp.ops[n]
        busy[n] += att + b
        run(n, t + att + b)

    for n in range(inp.nodes):
        run(n, 0.0)

    while heap:
        t, _, ev = heapq.heappop(heap)
        kind = ev[0]
        if kind == "ready":
            _, r_i, lay, h_i, min_end = ev
            h = routes[r_i].hops[h_i]
            lk = links.get(h.link)
            if lk is None:
                lk = links[h.link] = _Link()
            if lk.free and not (lk.queues[NET] or lk.queues[COMPUTE]):
                start(t, r_i, lay, h_i, min_end)
            else:
                lk.queues[routes[r_i].cls].append((r_i, lay, h_i, min_end))
        elif kind == "done":
            lk = links[ev[1]]
            lk.free = True
            q = lk.queues
            cls = lk.turn if q[lk.turn] else 1 - lk.turn
            if q[cls]:
                lk.turn = 1 - cls
                start(t, *q[cls].popleft())
        elif kind == "land":
            _, n, lay, r_i = ev
            last_landing = max(last_landing, t)
            if not needs[(r_i, n)]:
                continue
            pending[n][lay] -= 1
            w = waiting[n]
            if w is not None and w[0] == lay and pending[n][lay] == 0:
                waiting[n] = None
                waited[n] += t - w[1]
                after_wait(n, t)
        else:  # "wait"
            _, n, lay = ev
            if pending[n][lay] == 0:
                after_wait(n, t)
            else:
                waiting[n] = (lay, t)
    if any(w is not None for w in waiting):
        raise AssertionError("a node waits for a message no route delivers")  # pragma: no cover
    cycles = max(max(finish, default=0.0), last_landing)
    return StepTimeline(cycles, busy, finish, waited, last_landing, len(routes) * L,
                        {k: v.busy for k, v in links.items()})
