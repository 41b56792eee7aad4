"""Plan → JSON object and human-readable table (``mcf plan``)."""

from __future__ import annotations

__all__ = ["plan_dict", "plan_table", "scope_text", "assumptions_text", "payloads_text"]

MIB = 2 ** 20
GIB = 2 ** 30


def scope_text(p) -> str:
    L = p.model.layers
    if p.cluster.scope == "model":
        what = f"prefill of all {L} layers (linear layers + attention); LM head excluded"
    else:
        what = f"attention of all {L} layers only (eq 6), linear layers excluded"
    return f"TTFT covers the {what}"


def assumptions_text(cl) -> str:
    return (f"compute P_node = {cl.ops_per_dsp_cycle} ops x {cl.dsps} DSP x "
            f"{cl.clock_hz / 1e6:g} MHz x {cl.compute_eff:g} = {cl.p_node / 1e12:.3f} Tops/s "
            f"per node; network {cl.topology.describe()}; link efficiency {cl.link_eff:g}; "
            f"KV budget S_node = {cl.kv_budget / MIB:.1f} MiB, buffer M_buf = "
            f"{cl.buffer / MIB:g} MiB; gamma = {cl.gamma:g}; metadata push "
            f"{cl.t_meta_s * 1e6:g} us/record")


def _transfers(ts) -> list:
    return [{"kind": t.kind, "phase": t.phase, "block": t.block, "slice": t.slice,
             "src": t.src, "dests": list(t.dests), "route_id": t.route_id, "bytes": t.nbytes,
             "link_copies": t.tree.edges, "depth_hops": t.tree.depth} for t in ts]


def _step_dict(p, s, detail: bool = False) -> dict:
    c = s.cost
    owners = [n for n in range(p.cluster.nodes) if (s.index, n) in p.scheduler.dir.size]
    return {
        "index": s.index,
        "r_mem": s.r_mem,
        "r_reuse": s.r_reuse,
        "replica_factor": s.replica_factor,
        "owners": owners,
        "owner_tokens": [sum(b - a for a, b in rg) for rg in s.ranges],
        "replicas": [s.replicas.get(o, []) for o in owners],
        "active_replica_factor": round(s.active_replica_factor, 4),
        "drained": len(s.drains),
        "freed": len(s.frees),
        "converged": len(s.converge),
        "kept_fetched": len(s.kept),
        "draining_reads": s.draining_reads,
        "per_node_kv_bytes": list(s.node_kv_bytes),
        "rep_bytes": c.rep_bytes,
        "access_bytes": c.access_bytes,
        "rep_payload_bytes": c.rep_payload,
        "access_payload_bytes": c.access_payload,
        "t_comp_s": c.t_comp,
        "t_comm_s": c.t_comm,
        "t_sync_s": c.t_sync,
        "t_chunk_s": c.t_chunk,
        "bottleneck_link": c.bottleneck,
        "metadata_records_max_node": c.records,
        "multicast_routes": s.routes.trees,
        "route_fallbacks": s.routes.fallbacks,
    } | ({"transfers": _transfers(s.transfers)} if detail else {})


def plan_dict(p, detail: bool = False) -> dict:
    """The ``mcf plan --json`` object; ``detail`` adds every transfer (source, destinations,
    route id) per chunk."""
    t, cl, m = p.totals, p.cluster, p.model
    out = {
        "policy": p.policy,
        "model": {"name": m.name, "layers": m.layers, "q_heads": m.q_heads,
                  "kv_heads": m.kv_heads, "head_dim": m.head_dim, "kv_dtype": m.kv_dtype},
        "nodes": cl.nodes,
        "topology": cl.topology.kind,
        "seq_len": p.seq_len,
        "alpha": p.alpha,
        "node_config": cl.node_config,
        "reduce_slots": cl.reduce_slots,
        "keep_fetched": p.scheduler.keep_fetched,
        "bidirectional": p.scheduler.bidirectional,
        "m_token_bytes": m.m_token,
        "chunk_size": p.chunk,
        "num_chunks": p.num_chunks,
        "m_chunk_bytes": m.m_chunk(p.chunk),
        "kv_budget_bytes": cl.kv_budget,
        "buffer_bytes": cl.buffer,
        "max_payload_bytes": p.encoder.max_payload,
        "payloads": p.encoder.payloads.to_dict(),
        "chunk_choice": {"bound": p.choice.bound, "auto": p.choice.auto,
                         "explanation": p.choice.explanation,
                         "binding_chunk": p.choice.binding_chunk,
                         "buffer_max_tokens": p.choice.buffer_max_tokens,
                         "eq5_ok": p.choice.eq5_ok, "overlap_ok": p.choice.overlap_ok},
        "units": {"bytes": "B", "time": "s", "rep/access/comm bytes":
                  "bytes x hops (a node->switch->node hop counts once)"},
        "ttft_scope": scope_text(p),
        "assumptions": assumptions_text(cl),
        "p_node_ops_per_s": cl.p_node,
        "chunks": [_step_dict(p, s, detail) for s in p.steps],
        "totals": {
            "rep_bytes": t.rep_bytes, "access_bytes": t.access_bytes,
            "handoff_bytes": t.handoff_bytes, "comm_bytes": t.comm_bytes,
            "comm_gib": t.comm_bytes / GIB, "delivered_bytes": t.delivered_bytes,
            "ttft_s": t.ttft_s, "t_comp_s": t.t_comp_s,
            "t_exposed_comm_s": t.t_exposed_comm_s, "t_sync_s": t.t_sync_s,
            "peak_node_kv_bytes": t.peak_node_kv_bytes,
            "final_node_kv_bytes": t.final_node_kv_bytes,
            "final_owner_only": t.final_owner_only,
            "owned_gap_bytes": t.owned_gap_bytes, "max_slice_bytes": t.max_slice_bytes,
            "memory_ok": t.memory_ok, "route_fallbacks": t.route_fallbacks,
            "draining_reads": t.draining_reads, "metadata_records": t.metadata_records,
            "pressure_drains": t.pressure_drains, "converged": t.converged,
            "closed_form": t.closed_form,
        },
    }
    if p.handoff is not None:
        h = p.handoff.cost
        out["handoff"] = {"bytes": h.handoff_bytes, "t_s": h.t_chunk,
                          "per_node_kv_bytes": p.handoff.node_kv_bytes}
    return out


def _bar(frac: float, width: int = 12) -> str:
    k = round(max(0.0, min(1.0, frac)) * width)
    return "#" * k + "." * (width - k)


def payloads_text(pl) -> str:
    waves = "; ".join("+".join(f"{n}" for _, n in w) for w in pl.waves)
    return (f"packets <= {pl.max_payload} B: KV {pl.tokens_per_fragment} tokens x "
            f"{pl.token_record_bytes} B per KV head; decode query {pl.query_record_bytes} B per "
            f"layer sent as {len(pl.waves)} wave(s) of heads ({waves}) for "
            f"{pl.reduce_slots} reduction slots; state {pl.state_bytes} B per head")


def plan_table(p) -> str:
    t, cl = p.totals, p.cluster
    lines = [
        f"MARS plan: policy {p.policy}, model {p.model.name} ({p.model.kv_dtype} KV, "
        f"M_token = {p.model.m_token} B), S = {p.seq_len}, N = {cl.nodes}, alpha = {p.alpha:g}",
        f"assumptions: {assumptions_text(cl)}",
        f"chunk: {p.choice.explanation}",
        payloads_text(p.encoder.payloads),
        f"{scope_text(p)}; traffic in MiB = bytes x hops",
        "",
        f"{'c':>4} {'r_mem':>5} {'r_re':>4} {'r':>2} {'act.r':>5} {'drn':>4} "
        f"{'KV/node MiB max':>15} {'budget use':>12} {'rep MiB':>8} {'acc MiB':>8} "
        f"{'T_comp s':>9} {'T_comm s':>9} {'T_chunk s':>9}",
    ]
    for s in p.steps:
        c = s.cost
        mx = max(s.node_kv_bytes)
        lines.append(
            f"{s.index:>4} {min(s.r_mem, 999):>5} {s.r_reuse:>4} {s.replica_factor:>2} "
            f"{s.active_replica_factor:>5.2f} {len(s.drains):>4} {mx / MIB:>15.2f} "
            f"{_bar(mx / cl.kv_budget):>12} {c.rep_bytes / MIB:>8.1f} "
            f"{c.access_bytes / MIB:>8.1f} {c.t_comp:>9.4f} {c.t_comm:>9.4f} {c.t_chunk:>9.4f}")
    if p.handoff is not None:
        h = p.handoff.cost
        lines.append(f"{'hand':>4} KV hand-off to the decode pool: {h.handoff_bytes / MIB:.1f} "
                     f"MiB x hops, {h.t_chunk:.4f} s")
    lines += [
        "",
        f"TTFT {t.ttft_s:.4f} s (compute {t.t_comp_s:.4f} s, exposed communication "
        f"{t.t_exposed_comm_s:.4f} s, sync {t.t_sync_s:.4f} s)",
        f"traffic {t.comm_bytes / GIB:.3f} GiB x hops (replication {t.rep_bytes / GIB:.3f}, "
        f"access {t.access_bytes / GIB:.3f}, hand-off {t.handoff_bytes / GIB:.3f})",
        f"peak KV per node {t.peak_node_kv_bytes / MIB:.2f} MiB of {cl.kv_budget / MIB:g} MiB "
        f"({'within' if t.memory_ok else 'OVER'} budget); final layout "
        f"{'owner-only' if t.final_owner_only else 'NOT owner-only'}, owned bytes spread "
        f"{t.owned_gap_bytes} B (one slice = {t.max_slice_bytes} B)",
        f"replicas drained under memory pressure {t.pressure_drains}, at the convergence "
        f"deadline {t.converged}; reads served by draining replicas {t.draining_reads}",
        f"metadata records {t.metadata_records}; route fallbacks {t.route_fallbacks}; "
        f"node configuration {cl.node_config} ({cl.reduce_slots} reduction slots)",
    ]
    return "\n".join(lines)
