"""The chunk-step scheduler: replica factors, placement, routes, directory lifecycle (paper §4).

One step per chunk ``c = 1..C``, in three phases (the pipeline that lets MARS prefetch ahead):

1. **plan(c)** — while chunk ``c−1`` still computes: pick ``r(c)`` for the new block (eq 11–16,
   29). Every historical block ``i`` keeps the replica factor ``r(i)`` it was created with (eq 19
   charges block ``i`` for ``N − r(i)`` remote reads in every later chunk); a replica is drained
   only when memory pressure requires it — a node whose own slice of block ``c`` would not fit
   ``S_node`` drains replicas, cheapest first (the least increase of the remaining access cost
   of eq 19 per byte freed). Drained copies are DRAINING: they keep serving chunk ``c−1``. The
   history reads of chunk ``c`` are then scheduled from owner/VALID copies only: local where a
   copy is on the node, else fetched from the nearest copy (mesh-aware multicast tree per
   source), or streamed round the ring for the baselines.
2. **complete(c−1)** — chunk ``c−1`` finishes: its reads are served (from VALID, OWNER or
   DRAINING copies); DRAINING copies with no dependants left are freed.
3. **store(c)** — chunk ``c`` computes its KV block: every node stores the slice it owns, the
   owner multicasts it to ``r(c)−1`` replica holders with room (a full node is skipped, never
   emptied for a newer block), and the diagonal-block reads of chunk ``c`` are scheduled.

The convergence deadline (eq 29, ``r(C) = 1`` for the layout decode starts from) comes after the
last chunk: every replica still VALID is drained once chunk ``C`` has read it and freed
(``Step.converge`` of the last step), so decode starts owner-only.

A fetched copy is **not** kept as a replica by default: the paper creates replicas only by the
owner's propagation (eq 17) and gives each block one factor ``r(i)`` (eq 16), so a copy kept by
a reader would exceed it. ``keep_fetched=True`` keeps a fetched copy as a VALID replica when the
reader's budget has room (an extension, off in every reported figure).

Policies: ``mars``; ``ring`` and ``zigzag`` (r = 1, every chunk the owner's copy of each
history slice is streamed hop by hop round the logical ring; contiguous vs zigzag token layout;
``bidirectional`` (default) sends it both ways round on the full-duplex links, half of the
receivers each way, so every slice crosses each link at most once per direction and the chain is
``⌈(P−1)/2⌉`` hops — on a switch, where both ways would share the owner's one uplink, the
stream stays one way); ``full`` (r = N for every block, no budget, replicas dropped at the
deadline); ``pd`` (prefill pool of ⌊N/2⌋ nodes running zigzag, then every slice is handed off
to the decode pool).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cluster import ClusterSpec, Tree
from .directory import CopyState, Directory, InvariantError
from .layout import chunk_ranges
from .model import ModelSpec
from .placement import access_cost, assign_sources, holder_set
from .replicas import r_mem, r_reuse, replica_factor
from .routes import RouteAllocator, StepRoutes

__all__ = ["POLICIES", "Transfer", "Step", "Handoff", "Scheduler", "PlanError"]

POLICIES = ("mars", "ring", "zigzag", "full", "pd")


class PlanError(ValueError):
    """The requested plan cannot be built (bad or infeasible input); one-line message."""


@dataclass(frozen=True)
class Transfer:
    """One routed KV movement: ``nbytes`` (all layers) of slice ``(block, slice)``."""
    kind: str               # "replica" | "access" | "handoff"
    phase: str              # "plan" | "store" | "handoff"
    block: int
    slice: int              # the owner node of the slice
    tokens: int
    nbytes: int
    src: int
    dests: tuple
    tree: Tree
    latency_s: float        # from the start of the transfer's chain to its farthest receiver
    chain: bool = False     # a store-and-forward hop of ring streaming
    route_id: int | None = None


@dataclass
class Step:
    index: int
    r_mem: int
    r_reuse: int
    replica_factor: int
    ranges: list                        # per node: token ranges owned in this chunk
    replicas: dict = field(default_factory=dict)     # slice owner -> replica holders (block c)
    drains: list = field(default_factory=list)       # ((block, slice), node) marked at plan(c)
    frees: list = field(default_factory=list)        # ((block, slice), node) freed before store
    converge: list = field(default_factory=list)     # last step: ((block, slice), node) drained
                                                     # and freed at the deadline (after chunk C)
    kept: list = field(default_factory=list)         # keep_fetched: ((block, slice), node) kept
    transfers: list = field(default_factory=list)
    node_kv_bytes: list = field(default_factory=list)
    draining_reads: int = 0             # reads of chunk c served by copies that began
                                        # DRAINING while it was in flight
    active_replica_factor: float = 1.0  # mean copies per slice after store(c)
    pressure: dict = field(default_factory=dict)     # node -> bytes over S_node the drains of
                                                     # plan(c) had to free
    routes: StepRoutes | None = None
    cost: object = None                 # mcf.mars.cost.StepCost


@dataclass
class Handoff:
    transfers: list
    frees: list
    node_kv_bytes: list
    routes: StepRoutes | None = None
    cost: object = None


class Scheduler:
    """Builds the steps of one prefill. ``alpha`` (eq 15) and the cluster's ``kv_budget``
    (``S_node``, eq 10) are the inputs the replica factors depend on; ``keep_fetched`` and
    ``bidirectional`` are the options described in the module docstring."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, seq_len: int, chunk: int,
                 policy: str, alpha: float, *, keep_fetched: bool = False,
                 bidirectional: bool = True):
        if policy not in POLICIES:
            raise PlanError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
        n = cluster.nodes
        if chunk < 1 or seq_len < 1 or seq_len % chunk:
            raise PlanError(f"seq-len {seq_len} is not a multiple of the chunk size {chunk}")
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise PlanError("alpha must be a finite number >= 0")
        self.model, self.cluster, self.topo = model, cluster, cluster.topology
        self.seq_len, self.chunk, self.policy, self.alpha = seq_len, chunk, policy, alpha
        self.keep_fetched = keep_fetched and policy == "mars"
        self.bidirectional = bidirectional
        self.num_chunks = seq_len // chunk
        if policy == "pd":
            if n < 2:
                raise PlanError("pd needs at least 2 nodes (a prefill and a decode pool)")
            self.pool = list(range(n // 2))
            self.decode_pool = list(range(n // 2, n))
        else:
            self.pool = list(range(n))
            self.decode_pool = list(range(n))
        if chunk < len(self.pool):
            raise PlanError(f"chunk {chunk} is smaller than the {len(self.pool)} nodes that "
                            f"share it (every node computes part of every chunk)")
        self.layout = "contiguous" if policy == "ring" else "zigzag"
        budgeted = policy == "mars"
        self.dir = Directory(n, cluster.kv_budget if budgeted else None)
        self.routes = RouteAllocator(self.topo, reduce_shape=cluster.decode_reduce)
        self.steps: list[Step] = []
        self.handoff: Handoff | None = None
        self.final_frees: list = []
        self._check_owner_only_fits()

    # --- helpers -----------------------------------------------------------------------------
    def ranges(self, c: int) -> list:
        """Token ranges of chunk ``c`` per cluster node (empty for nodes outside the pool)."""
        per_pool = chunk_ranges(c, self.chunk, len(self.pool), self.layout)
        out = [[] for _ in range(self.cluster.nodes)]
        for i, node in enumerate(self.pool):
            out[node] = per_pool[i]
        return out

    @staticmethod
    def tokens(ranges) -> int:
        return sum(b - a for a, b in ranges)

    def _owner_only_bytes(self) -> list[int]:
        owned = [0] * self.cluster.nodes
        for c in range(1, self.num_chunks + 1):
            for node, rg in enumerate(self.ranges(c)):
                owned[node] += self.tokens(rg) * self.model.m_token
        return owned

    def _check_owner_only_fits(self) -> None:
        if self.policy != "mars":
            return
        owned = self._owner_only_bytes()
        need = max(owned)
        if need > self.cluster.kv_budget:
            raise PlanError(
                f"KV budget {self.cluster.kv_budget / 2**20:.3f} MiB per node is too small even "
                f"for the owner-only layout, which needs {need / 2**20:.3f} MiB on node "
                f"{owned.index(need)}")

    def _target(self, c: int) -> tuple[int, int, int]:
        n, m = self.cluster.nodes, self.model
        rm = r_mem(n, self.cluster.kv_budget, m.m_hist(c, self.chunk))
        if self.policy == "mars":
            rr = r_reuse(c, self.num_chunks, n, self.alpha)
            return rm, rr, replica_factor(c, self.num_chunks, n, rm, rr)
        if self.policy == "full":
            return rm, n, n
        return rm, 1, 1

    def remaining_reads(self, c: int) -> int:
        """Chunks that still read every block ``i ≤ c`` once plan(c) starts: ``c..C``."""
        return self.num_chunks - c + 1

    def drain_cost(self, key, node: int, c: int) -> int:
        """Eq 19's remaining access cost (bytes × hops over chunks ``c..C``) that draining the
        copy of ``key`` on ``node`` adds: every later chunk's non-holders read from one copy
        fewer."""
        held = self.dir.schedulable(key)
        rest = [h for h in held if h != node]
        return (self.remaining_reads(c) * self.dir.size[key]
                * (access_cost(self.topo, rest) - access_cost(self.topo, held)))

    # --- reads -------------------------------------------------------------------------------
    def _ring_chains(self, owner: int) -> list[list[int]]:
        """The node orders a slice of ``owner`` is streamed along: one chain round the logical
        ring, or (bidirectional) one each way, half of the receivers each (owners alternate
        which way takes the odd receiver, so both directions carry the same load)."""
        pool, k = self.pool, self.pool.index(owner)
        p = len(pool)
        if p < 2:
            return []
        if not self.bidirectional or self.topo.base_kind == "switch":
            # (on a switch both ways would leave on the owner's one uplink: one chain)
            return [[pool[(k + j) % p] for j in range(p)]]
        fwd = (p - 1 + (k % 2 == 0)) // 2 if (p - 1) % 2 else (p - 1) // 2
        back = p - 1 - fwd
        chains = [[pool[(k + j) % p] for j in range(fwd + 1)],
                  [pool[(k - j) % p] for j in range(back + 1)]]
        return [ch for ch in chains if len(ch) > 1]

    def _schedule_reads(self, c: int, keys, phase: str, out: list) -> None:
        """Every pool node reads every slice in ``keys`` for chunk ``c``."""
        topo, d = self.topo, self.dir
        streaming = self.policy in ("ring", "zigzag", "pd")
        for key in keys:
            nbytes = d.size[key]
            tokens = nbytes // self.model.m_token
            owner = d.owner(key)
            if streaming:
                # Ring streaming: the owner's copy travels hop by hop round the logical ring.
                for order in self._ring_chains(owner):
                    lat = 0.0
                    for a, b in zip(order, order[1:]):
                        tree = topo.tree(a, [b])
                        lat += tree.latency_s
                        out.append(Transfer("access", phase, key[0], key[1], tokens, nbytes, a,
                                            (b,), tree, lat, chain=True))
                d.register_read(key, owner, c)     # every pool node reads the streamed owner copy
                continue
            sources = d.schedulable(key)
            requesters = [n for n in self.pool if n not in sources]
            for node in self.pool:
                if node in sources:
                    d.register_read(key, node, c)
            for src, reqs in sorted(assign_sources(topo, sources, requesters).items()):
                tree = topo.tree(src, reqs)
                out.append(Transfer("access", phase, key[0], key[1], tokens, nbytes, src,
                                    tree.dests, tree, tree.latency_s))
                d.register_read(key, src, c)

    def _keep_fetched(self, step: Step, transfers, reserve) -> None:
        """``keep_fetched``: a fetched copy stays as a VALID replica where the reader has room
        (``reserve``: bytes per node still to arrive this step, e.g. its own slice)."""
        d = self.dir
        for t in transfers:
            if t.kind != "access" or t.chain:
                continue
            key = (t.block, t.slice)
            for node in t.dests:
                if d.state(key, node) is None and \
                        d.used[node] + max(reserve[node], 0) + d.size[key] <= d.budget:
                    d.add_replica(key, node)
                    step.kept.append((key, node))

    # --- phases ------------------------------------------------------------------------------
    def _plan(self, step: Step) -> None:
        c, d = step.index, self.dir
        history = [k for k in d.slices() if k[0] < c]
        if self.policy == "mars":
            self._relieve_pressure(step, history)
        start = len(step.transfers)
        self._schedule_reads(c, history, "plan", step.transfers)
        if self.keep_fetched:
            own = [self.tokens(rg) * self.model.m_token for rg in step.ranges]
            draining = [sum(d.size[k] for k in history if d.state(k, n) is CopyState.DRAINING)
                        for n in range(self.cluster.nodes)]
            # a kept copy must leave room for the node's own slice once its drains are freed
            self._keep_fetched(step, step.transfers[start:],
                               [own[n] - draining[n] for n in range(self.cluster.nodes)])

    def _relieve_pressure(self, step: Step, history) -> None:
        """Drain replicas on any node that would exceed ``S_node`` once its own slice of block
        ``c`` arrives: the copies whose loss adds the least remaining access cost (eq 19) per
        byte freed, older blocks first on ties. Nothing else drains before the deadline."""
        d, budget, c = self.dir, self.cluster.kv_budget, step.index
        for node in range(self.cluster.nodes):
            draining = sum(d.size[k] for k in history
                           if d.state(k, node) is CopyState.DRAINING)
            projected = d.used[node] - draining + \
                self.tokens(step.ranges[node]) * self.model.m_token
            if projected <= budget:
                continue
            step.pressure[node] = projected - budget
            while projected > budget:
                victims = [k for k in history if d.state(k, node) is CopyState.VALID]
                if not victims:
                    raise InvariantError(f"node {node} cannot fit block {c} "
                                         f"even after draining every replica")
                key = min(victims, key=lambda k: (
                    self.drain_cost(k, node, c) / d.size[k], k))
                d.mark_draining(key, node)
                step.drains.append((key, node))
                projected -= d.size[key]

    def _complete(self, c: int, step: Step | None) -> list:
        served = self.dir.serve_reads(c)
        if step is not None:
            step.draining_reads = served
        return self.dir.free_drained()

    def _store(self, step: Step) -> None:
        c, d, topo = step.index, self.dir, self.topo
        m_token = self.model.m_token
        new_keys = []
        for node in self.pool:
            tok = self.tokens(step.ranges[node])
            if tok:
                d.add_owner((c, node), node, tok * m_token)
                new_keys.append((c, node))
        r = step.replica_factor
        if r > 1:
            k = (c - 1) % len(self.pool)
            for owner in self.pool[k:] + self.pool[:k]:
                key = (c, owner)
                if key not in d.copies:
                    continue
                size = d.size[key]
                if d.budget is None:
                    allowed = frozenset(self.pool)
                else:
                    allowed = frozenset(x for x in self.pool
                                        if x == owner or d.used[x] + size <= d.budget)
                holders = holder_set(topo, owner, r, allowed)[1:]
                for h in holders:
                    d.add_replica(key, h)
                step.replicas[owner] = list(holders)
                if holders:
                    tree = topo.tree(owner, holders)
                    step.transfers.append(Transfer("replica", "store", c, owner,
                                                   size // m_token, size, owner, tree.dests,
                                                   tree, tree.latency_s))
        start = len(step.transfers)
        self._schedule_reads(c, new_keys, "store", step.transfers)
        if self.keep_fetched:
            self._keep_fetched(step, step.transfers[start:], [0] * self.cluster.nodes)
        d.check()
        step.node_kv_bytes = list(d.used)
        copies = [len(cps) for cps in d.copies.values()]
        step.active_replica_factor = sum(copies) / len(copies) if copies else 1.0

    def _converge(self, last: Step) -> None:
        """The deadline (eq 29): once chunk ``C`` has read them, every replica drains."""
        for key in self.dir.slices():
            for node in self.dir.holders(key, CopyState.VALID):
                self.dir.mark_draining(key, node)
                last.converge.append((key, node))

    # --- driver ------------------------------------------------------------------------------
    def run(self, progress=None) -> None:
        C = self.num_chunks
        prev: Step | None = None
        for c in range(1, C + 1):
            rm, rr, r = self._target(c)
            step = Step(c, rm, rr, r, self.ranges(c))
            self._plan(step)
            if prev is not None:
                step.frees = self._complete(c - 1, prev)
            self._store(step)
            step.transfers, step.routes = self.routes.assign(c, step.transfers)
            self.steps.append(step)
            prev = step
            if progress is not None:
                progress(c)
        self._converge(self.steps[-1])
        self.final_frees = self._complete(C, prev)
        if self.policy == "pd":
            self._handoff()
        self.dir.check()
        self.dir.check_owner_only()
        self._check_balanced()

    def _check_balanced(self) -> None:
        """The decode-ready layout is evenly sharded: owned bytes differ by at most a slice."""
        owned = self.dir.owned_bytes()
        pool = [owned[n] for n in self.decode_pool]
        slice_max = max(self.dir.size.values(), default=0)
        if max(pool) - min(pool) > slice_max:
            raise InvariantError(f"final layout unbalanced: owned bytes {pool} differ by more "
                                 f"than one slice ({slice_max} B)")

    def _handoff(self) -> None:
        """PD disaggregation: each slice moves to the decode-pool node holding the fewest bytes
        so far (ties: lowest id), so owned bytes end within one slice of each other."""
        d, topo, dp = self.dir, self.topo, self.decode_pool
        transfers, frees = [], []
        load = dict.fromkeys(dp, 0)
        for key in sorted(d.slices()):
            src = d.owner(key)
            dst = min(dp, key=lambda x: (load[x], x))
            load[dst] += d.size[key]
            tree = topo.tree(src, [dst])
            transfers.append(Transfer("handoff", "handoff", key[0], key[1],
                                      d.size[key] // self.model.m_token, d.size[key], src,
                                      (dst,), tree, tree.latency_s))
            d.move_owner(key, dst)
            frees.append((key, src))
        transfers, routes = self.routes.assign(self.num_chunks + 1, transfers)
        self.handoff = Handoff(transfers, frees, list(d.used), routes)
