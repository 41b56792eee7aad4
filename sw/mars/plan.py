"""``mcf.mars.plan``: schedule a prefill, cost it, expose its metadata streams and route tables.

    from mcf.mars import plan, get_model, make_cluster
    p = plan(get_model("qwen2.5-1.5b"), make_cluster(8, 64, node_config="kr260"),
             seq_len=16384, chunk=1024, policy="mars", alpha=0.5)
    p.totals.ttft_s, p.steps[0].cost.t_chunk
    p.step_metadata(3)          # {node: [Meta, ...]} for chunk step 3
    p.static_routes()           # [(node, route_id, entry)] programmed once
    p.steps[2].routes.entries   # [(node, route_id, entry)] for step 3's bank
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..abi import META
from .chunking import ChunkChoice, choose_chunk
from .cluster import ClusterSpec, make_topology
from .cost import c_full, c_mars, c_ring, step_cost
from .metadata import MetaEncoder, Record, ReduceEntry, by_node, pack_fast, payloads
from .model import ModelSpec, get_model
from .placement import holder_set
from .schedule import Handoff, PlanError, Scheduler, Step

__all__ = ["Plan", "Totals", "plan", "tiny_plan"]


@dataclass
class Totals:
    rep_bytes: int
    access_bytes: int
    handoff_bytes: int
    comm_bytes: int
    delivered_bytes: int
    ttft_s: float
    t_comp_s: float
    t_exposed_comm_s: float
    t_sync_s: float
    peak_node_kv_bytes: int
    final_node_kv_bytes: list
    final_owner_only: bool
    owned_gap_bytes: int         # max − min owned bytes at the end
    max_slice_bytes: int         # largest single slice (the balance tolerance)
    memory_ok: bool              # every node within S_node at every step
    route_fallbacks: int
    draining_reads: int
    metadata_records: int
    pressure_drains: int         # replicas drained before the deadline (budget)
    converged: int               # replicas drained at the deadline (after chunk C)
    closed_form: dict = field(default_factory=dict)


@dataclass
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    policy: str
    alpha: float
    seq_len: int
    choice: ChunkChoice
    scheduler: Scheduler
    encoder: MetaEncoder
    totals: Totals | None = None
    streams: bool = True         # False: a cost-only plan (ids may exceed the ABI's fields)

    @property
    def chunk(self) -> int:
        return self.choice.chunk

    @property
    def num_chunks(self) -> int:
        return self.seq_len // self.chunk

    @property
    def steps(self) -> list[Step]:
        return self.scheduler.steps

    @property
    def handoff(self) -> Handoff | None:
        return self.scheduler.handoff

    # --- metadata ----------------------------------------------------------------------------
    def step_records(self, index: int) -> list[Record]:
        """Records of chunk step ``index`` (1-based), in issue order, tagged with node/phase."""
        if not self.streams:
            raise PlanError("a cost-only plan (streams=False) has no metadata streams")
        step = self.steps[index - 1]
        return self.encoder.step_records(step, self.scheduler.routes.unicast)

    def step_metadata(self, index: int) -> dict[int, list]:
        """``{node: [Meta, ...]}`` for chunk step ``index``: what each node's driver writes
        into its command rings."""
        return by_node(self.step_records(index), self.cluster.nodes)

    def step_words(self, index: int) -> dict[int, list[int]]:
        """The same streams packed with the ABI layout (64-bit words)."""
        return {n: [pack_fast(m) for m in ms] for n, ms in self.step_metadata(index).items()}

    def handoff_metadata(self) -> dict[int, list]:
        if self.handoff is None:
            return {n: [] for n in range(self.cluster.nodes)}
        return by_node(self.encoder.handoff_records(self.handoff, self.scheduler.routes.unicast),
                       self.cluster.nodes)

    def static_routes(self) -> list[tuple[int, int, int]]:
        """Unicast route-table entries ``(node, route_id, entry)``, programmed once."""
        return self.scheduler.routes.static_entries()

    def route_programming(self) -> list[tuple[int, int, list]]:
        """``(step, phase, entries)``: the static table first (step 0), then each step's bank
        (write it while the previous step runs), then the decode bank."""
        out = [(0, "static", self.static_routes())]
        out += [(s.index, "bank", s.routes.entries) for s in self.steps]
        if self.handoff is not None:
            out.append((self.num_chunks + 1, "handoff", self.handoff.routes.entries))
        out.append((self.num_chunks + 1, "decode", self.decode_routes()[2].entries))
        return out

    # --- decode ------------------------------------------------------------------------------
    def decode_routes(self):
        return self.scheduler.routes.decode_trees(self.num_chunks + 1)

    def decode_owner(self, k: int) -> int:
        """Owner of decode token ``k`` (0-based): new KV goes to the least-loaded node of the
        decode pool (ties: lowest id), keeping the owner-only layout balanced."""
        owned = {n: 0 for n in self.scheduler.decode_pool}
        for key in self.scheduler.dir.slices():
            owned[self.scheduler.dir.owner(key)] += self.scheduler.dir.size[key]
        root = None
        for _ in range(k + 1):
            root = min(owned, key=lambda n: (owned[n], n))
            owned[root] += self.model.m_token
        return root

    def decode_records(self, k: int) -> list[Record]:
        """Records of decode token ``k`` in issue order, with the root's waits between waves
        (``Record.wait``, see :mod:`mcf.mars.metadata`)."""
        bcast, reduce_, _ = self.decode_routes()
        root = self.decode_owner(k)
        return self.encoder.decode_records(k, root, bcast[root], reduce_[root])

    def decode_reduce_configs(self, k: int) -> list[ReduceEntry]:
        """The reduction-engine entry each node needs for token ``k``: ``1 + children``
        contributors on the root's reduction tree; the root's entry is ``final`` with the
        root's static unicast route as ``result_route`` (the ABI's final-result rule)."""
        _, reduce_, _ = self.decode_routes()
        root = self.decode_owner(k)
        children = self.scheduler.routes.children(root)
        home = self.scheduler.routes.unicast(root)
        return [ReduceEntry(n, reduce_[root], 1 + children[n], n == root,
                            home if n == root else 0) for n in range(self.cluster.nodes)]

    def decode_waits(self, k: int) -> list[tuple[int, int, int]]:
        """``(node, index in its stream, wait)`` of every decode record of token ``k`` that
        waits for reduction results (the root's query fragments of every wave but the first)."""
        pos = {n: 0 for n in range(self.cluster.nodes)}
        out = []
        for r in self.decode_records(k):
            if r.wait:
                out.append((r.node, pos[r.node], r.wait))
            pos[r.node] += 1
        return out

    def decode_metadata(self, k: int) -> tuple[dict[int, list], list[ReduceEntry]]:
        """Streams for decode token ``k`` and the reduction configuration each node's reduction
        engine needs (:meth:`decode_reduce_configs`)."""
        return (by_node(self.decode_records(k), self.cluster.nodes),
                self.decode_reduce_configs(k))

    # --- output ------------------------------------------------------------------------------
    def to_dict(self, detail: bool = False) -> dict:
        from .report import plan_dict
        return plan_dict(self, detail)

    def write_metadata(self, folder, decode_tokens: int = 1) -> list[str]:
        """Write every node's packed stream per step (``step_0001.node_00.bin``: little-endian
        64-bit words; ``handoff.node_NN.bin``, ``decode_0000.node_NN.bin``) and
        ``routes.json`` (route-table programming, switch groups, reduction configs, the decode
        waits ``[node, record index, results]`` and the payload cuts)."""
        import json
        import pathlib
        out = pathlib.Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        nbytes = (META.size + 7) // 8
        written = []

        def dump(name: str, streams: dict) -> None:
            for node, metas in streams.items():
                path = out / f"{name}.node_{node:02d}.bin"
                path.write_bytes(b"".join(pack_fast(m).to_bytes(nbytes, "little")
                                          for m in metas))
                written.append(str(path))

        for s in self.steps:
            dump(f"step_{s.index:04d}", self.step_metadata(s.index))
        if self.handoff is not None:
            dump("handoff", self.handoff_metadata())
        configs, waits = [], []
        for k in range(decode_tokens):
            streams, cfg = self.decode_metadata(k)
            dump(f"decode_{k:04d}", streams)
            configs.append([c.to_dict() for c in cfg])
            waits.append(self.decode_waits(k))
        routes = {
            "programming": [{"step": st, "kind": kind, "entries": entries}
                            for st, kind, entries in self.route_programming()],
            "switch_groups": {s.index: s.routes.switch_groups for s in self.steps},
            "decode_reduce_configs": configs,
            "decode_waits": waits,
            "payloads": self.encoder.payloads.to_dict(),
        }
        (out / "routes.json").write_text(json.dumps(routes))
        written.append(str(out / "routes.json"))
        return written


def _closed_form(p: Plan) -> dict:
    """Eq 18–22 with the plan's own factors and the topology's mean distances."""
    topo, n, m = p.cluster.topology, p.cluster.nodes, p.model.m_chunk(p.chunk)
    factors = [s.replica_factor for s in p.steps]
    h = topo.mean_hops
    # h_dis: hops per copy of a MARS multicast tree; h_near: mean distance of a non-holder.
    h_dis, h_near = [], []
    for s in p.steps:
        if s.replica_factor > 1:
            trees = [topo.tree(o, holder_set(topo, o, s.replica_factor)) for o in range(n)]
            h_dis.append(sum(t.edges for t in trees) / sum(len(t.dests) for t in trees))
    for r in sorted(set(factors)):
        hs = holder_set(topo, 0, r)
        others = [x for x in range(n) if x not in hs]
        if others:
            h_near.append(sum(min(topo.hops(x, y) for y in hs) for x in others) / len(others))
    hd = sum(h_dis) / len(h_dis) if h_dis else h
    hn = sum(h_near) / len(h_near) if h_near else h
    return {
        "h_dis": hd, "h_near": hn, "h_ring": 1.0 if n > 1 else 0.0,
        "c_mars_bytes": c_mars(m, n, factors, hd, hn),
        "c_ring_bytes": c_ring(m, n, p.num_chunks, 1.0 if n > 1 else 0.0),
        "c_full_bytes": c_full(m, n, p.num_chunks, hd if n > 1 else 0.0),
    }


def _finish(p: Plan) -> None:
    sched, cl = p.scheduler, p.cluster
    recs_total = 0
    for s in p.steps:
        counts = p.encoder.count_step_records(s)
        recs_total += sum(counts)
        s.cost = step_cost(p.model, cl, s.ranges, s.transfers, max(counts))
    if p.handoff is not None:
        counts = [0] * cl.nodes
        for t in p.handoff.transfers:
            counts[t.src] += p.model.layers * len(p.encoder.fragments(t.tokens))
        for _, node in p.handoff.frees:
            counts[node] += p.model.layers
        recs_total += sum(counts)
        p.handoff.cost = step_cost(p.model, cl, [[] for _ in range(cl.nodes)],
                                   p.handoff.transfers, max(counts))
    costs = [s.cost for s in p.steps] + ([p.handoff.cost] if p.handoff else [])
    d = sched.dir
    owned = d.owned_bytes()
    pool_owned = [owned[n] for n in sched.decode_pool]
    peak = max(d.peak)
    rep = sum(c.rep_bytes for c in costs)
    acc = sum(c.access_bytes for c in costs)
    hand = sum(c.handoff_bytes for c in costs)
    try:
        d.check_owner_only()
        owner_only = True
    except Exception:
        owner_only = False
    p.totals = Totals(
        rep_bytes=rep, access_bytes=acc, handoff_bytes=hand, comm_bytes=rep + acc + hand,
        delivered_bytes=sum(c.rep_payload + c.access_payload for c in costs) + sum(
            t.nbytes for t in (p.handoff.transfers if p.handoff else [])),
        ttft_s=sum(c.t_chunk for c in costs),
        t_comp_s=sum(c.t_comp for c in costs),
        t_exposed_comm_s=sum(max(0.0, c.t_comm - c.t_comp) for c in costs),
        t_sync_s=sum(c.t_sync for c in costs),
        peak_node_kv_bytes=peak, final_node_kv_bytes=list(d.used),
        final_owner_only=owner_only,
        owned_gap_bytes=max(pool_owned) - min(pool_owned),
        max_slice_bytes=max(d.size.values()),
        memory_ok=peak <= cl.kv_budget,
        route_fallbacks=sum(s.routes.fallbacks for s in p.steps),
        draining_reads=sum(s.draining_reads for s in p.steps),
        metadata_records=recs_total,
        pressure_drains=sum(len(s.drains) for s in p.steps),
        converged=sum(len(s.converge) for s in p.steps),
        closed_form=_closed_form(p))


def plan(model: ModelSpec, cluster: ClusterSpec, seq_len: int, chunk: int | None,
         policy: str, alpha: float, progress=None, *, keep_fetched: bool = False,
         bidirectional: bool = True, streams: bool = True) -> Plan:
    """Schedule and cost a prefill of ``seq_len`` tokens. ``chunk=None`` picks ``B*`` by eq 8;
    ``alpha`` is eq 15's and the cluster's ``kv_budget`` is ``S_node`` (both explicit: see
    :mod:`mcf.mars.setting`). ``keep_fetched`` / ``bidirectional``: see
    :mod:`mcf.mars.schedule`. ``streams=False`` builds a cost-only plan whose ids may exceed
    ``Meta.kv_id`` / ``Meta.seq`` (the unchunked baselines). ``progress``: optional callable
    ``(done, total)``. Raises :class:`PlanError` on bad input."""
    if seq_len < 1:
        raise PlanError("seq-len must be >= 1")
    if not (alpha >= 0 and alpha < float("inf")):
        raise PlanError("alpha must be a finite number >= 0")
    if chunk is not None and (chunk < 1 or seq_len % chunk):
        raise PlanError(f"seq-len {seq_len} is not a multiple of the chunk size {chunk}")
    try:
        payloads(model, cluster.max_payload, cluster.reduce_slots)   # single records must fit
        choice = choose_chunk(model, cluster, seq_len, alpha, chunk)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    sched = Scheduler(model, cluster, seq_len, choice.chunk, policy, alpha,
                      keep_fetched=keep_fetched, bidirectional=bidirectional)
    try:
        encoder = MetaEncoder(model, cluster.nodes, seq_len // choice.chunk,
                              cluster.max_payload, cluster.reduce_slots, strict=streams)
        encoder.fragments(-(-choice.chunk // len(sched.pool)))
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    total = sched.num_chunks
    sched.run(None if progress is None else (lambda c: progress(c, total)))
    p = Plan(model, cluster, policy, alpha, seq_len, choice, sched, encoder, streams=streams)
    _finish(p)
    return p


def tiny_plan(nodes: int = 2, seq_len: int = 64, chunk: int = 32,
              model: ModelSpec | None = None) -> Plan:
    """The plan the RTL node benches run (``mcf.sim.benches.node_cluster``, ``board_node``) and
    the system model replays (:func:`mcf.sysmodel.validate.rtl_plan`): ``model`` (default
    :func:`get_model` ``("tiny")``) on a ``kr260-ring`` of ``nodes`` with 1 MiB KV and buffer
    budgets, policy ``mars``, ``α = 0.5``."""
    cl = ClusterSpec(nodes, 1 << 20, 1 << 20, make_topology("kr260-ring", nodes))
    return plan(model or get_model("tiny"), cl, seq_len, chunk, "mars", alpha=0.5)
