"""The checks a cluster run makes of every node, whichever back end drives it (docs/cluster.md
"Checks"): they read only what a host can read from a node — its DDR, through ``mem`` indexed by
bus address (``mem[a:b]`` gives bytes), and its status registers, as a dict by name — so the
simulated hosts (``mcf.sim.benches``) and the PYNQ hosts (:mod:`mcf.cluster.board`) run the same
checks. A failed check raises ``AssertionError`` naming the node, step or token and what
differs."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..abi.directory import DirState
from ..abi.kv import kv_token_bytes
from ..abi.kv_reader import block_address
from ..node.decode import decode_kv_id, decode_seq, decode_slot, owned_blocks, slice_tokens
from ..node.layer import read_act, read_set, slice_positions

__all__ = ["BAD_WORDS", "CONFIG_REGS", "bad_counter_names", "bad_counters", "act_rows",
           "check_layer_memory", "STEP_PREFIXES", "step_counter_names", "check_step_counters",
           "check_owned_kv", "check_decode_root", "directory_ids", "held_from_directory",
           "link_counter_names", "link_faults"]

BAD_WORDS = ("drop", "bad", "error", "timeouts", "overrun", "reject", "sat", "unmapped")
"""A status counter whose name holds one of these counts something that must not happen."""
CONFIG_REGS = ("reduce_timeout", "a2a_timeout")
"""Lower-case registers that are settings, not counters."""

STEP_PREFIXES = {"land_": ("packets", "bytes"), "emit_": ("records", "tokens", "local", "staged"),
                 "att_": ("records", "blocks"),
                 "jobs_": ("jobs", "entries", "fences", "fence_cycles"),
                 "kvr_": ("blocks", "tokens", "jobs")}
"""Counter families checked after a prefill step: every counter but the named (work done) must
be zero."""


def bad_counter_names(regmap) -> list[str]:
    """The status counters :func:`bad_counters` looks at."""
    return [reg.name for _, reg in regmap
            if reg.name.islower() and reg.name not in CONFIG_REGS
            and any(w in reg.name for w in BAD_WORDS)]


def bad_counters(values: dict[str, int]) -> dict[str, int]:
    """The non-zero ones of :func:`bad_counter_names`' counters in ``values``."""
    return {n: v for n, v in values.items() if v and n.islower() and n not in CONFIG_REGS
            and any(w in n for w in BAD_WORDS)}


def act_rows(mem, addr: int, rows: int, cols: int) -> np.ndarray:
    """``rows`` ACT rows of ``cols`` words at bus address ``addr``."""
    return read_act(bytes(mem[addr: addr + rows * cols * 4]), rows, cols)


def check_layer_memory(mem, node: int, p, idx: int, model, layout, gold) -> None:
    """After prefill step ``idx`` of the layer program, node ``node``'s DDR bit for bit against
    ``gold`` (:func:`~mcf.golden.node_prefill.golden_prefill`'s layers): every layer's attention
    output and output rows of its slice, and the INT4 KV of every block it attended to (its own and
    the ones it received)."""
    enc, cfg, m = p.encoder, model.cfg, model.tokens
    rec = kv_token_bytes(cfg.head_dim)
    p0, _ = slice_positions(p, idx, node)
    for li, lb in enumerate(model.bufs):
        want = gold[li]
        att = act_rows(mem, lb.buf["att"], m, cfg.heads * cfg.head_dim)
        bad = np.argwhere(att != want.att[p0:p0 + m])
        assert bad.size == 0, (f"step {idx} node {node} layer {li}: attention output differs "
                               f"at {len(bad)} places, first {bad[0]}")
        y = act_rows(mem, lb.buf["y"], m, cfg.hidden)
        bad = np.argwhere(y != want.y[p0:p0 + m])
        assert bad.size == 0, (f"step {idx} node {node} layer {li}: output differs at "
                               f"{len(bad)} places, first {bad[0]}")
        for b, s in read_set(p, idx, node):
            q0, qn = slice_positions(p, b, s)
            for g in range(cfg.kv_heads):
                a = block_address(layout.kv, enc.kv_id(li, b, s), g, layout.kv_layout)
                got = bytes(mem[a: a + qn * rec])
                assert got == want.kv[g][q0 * rec:(q0 + qn) * rec], (
                    f"step {idx} node {node} layer {li}: KV of block {b} slice {s} head {g} "
                    "differs")


def step_counter_names(regmap) -> list[str]:
    """The registers :func:`check_step_counters` reads."""
    names = [reg.name for _, reg in regmap]
    out = [n for n in names if n.startswith(tuple(STEP_PREFIXES))]
    out += [f"{k}{q}_{c}" for q in range(2) for k, c in
            (("cmd", "bad_records"), ("seq", "bad_runtime"), ("seq", "timeouts"))]
    return out + [n for n in names if n.startswith("parser") and "_drop_" in n]


def check_step_counters(node: int, values: dict[str, int], land_packets: int) -> None:
    """Node ``node``'s counters after a prefill step (``values``: at least
    :func:`step_counter_names`): ``land_packets`` packets landed, no landing fault, nothing but
    work counted by the EMIT, ATTEND, JOB and KV-reader units, no bad record, run-time fault or
    timeout in either queue, no drop at any parser."""
    assert values["land_packets"] == land_packets, (
        f"node {node}: {values['land_packets']} packets landed, {land_packets} planned")
    for prefix, good in STEP_PREFIXES.items():
        bad = {k: v for k, v in values.items() if k.startswith(prefix) and v
               and k[len(prefix):] not in good}
        assert not bad, f"node {node}: {bad}"
    for q in range(2):
        for name in (f"cmd{q}_bad_records", f"seq{q}_bad_runtime", f"seq{q}_timeouts"):
            assert values[name] == 0, f"node {node}: {name} = {values[name]}"
    drops = {k: v for k, v in values.items() if k.startswith("parser") and "_drop_" in k and v}
    assert not drops, f"node {node}: parser drops {drops}"


def check_owned_kv(mem, node: int, p, lay, prefill) -> None:
    """The prompt's KV node ``node`` owns after the prefill
    (:func:`~mcf.node.decode.owned_blocks`), read from its DDR, bit for bit as ``prefill``
    (:func:`~mcf.golden.node_prefill.golden_prefill`'s layers) has it."""
    enc = p.encoder
    S = p.num_chunks * p.chunk
    for b, s in owned_blocks(p)[node]:
        q0, qn = slice_positions(p, b, s)
        for li, gl in enumerate(prefill):
            for g, raw in enumerate(gl.kv):
                a = lay.kv.kv_base + enc.kv_id(li, b, s) * lay.kv.kv_slot + \
                    g * lay.kv_layout.head_stride
                rec = len(raw) // S
                assert bytes(mem[a: a + qn * rec]) == raw[q0 * rec:(q0 + qn) * rec], \
                    f"node {node}: prompt KV of block {b} slice {s} layer {li} head {g}"


def check_decode_root(mem, root: int, p, image, gold, k: int) -> None:
    """Decode token ``k`` at its root (DDR ``mem``) bit for bit against ``gold``
    (:func:`~mcf.golden.node_decode.golden_decode`'s layers): the OBUF rows and output row of every
    layer and the new token's INT4 KV in its decode block."""
    _, j = decode_slot(p, k)
    cfg, lay = image.cfg, image.layout
    T = slice_tokens(p)
    nq = cfg.heads * cfg.head_dim
    for li, gl in enumerate(gold):
        obuf = act_rows(mem, image.obuf_rows(li), 1, nq)[0]
        bad = np.flatnonzero(obuf != gl.att)
        assert bad.size == 0, (f"token {k} root {root} layer {li}: OBUF differs at {bad.size} "
                               f"of {nq} words, first {bad[0]}: {obuf[bad[0]]} vs "
                               f"{gl.att[bad[0]]}")
        y = act_rows(mem, image.dbufs[li].buf["y"], 1, cfg.hidden)[0]
        bad = np.flatnonzero(y != gl.y)
        assert bad.size == 0, f"token {k} root {root} layer {li}: output differs at {bad.size}"
        for g in range(cfg.kv_heads):
            a = lay.kv_address(decode_kv_id(p, li, root, j // T), decode_seq(p, j % T, g))
            assert bytes(mem[a: a + len(gl.kv[g])]) == gl.kv[g], \
                f"token {k} root {root} layer {li}: new token's KV of head {g}"


def directory_ids(p) -> list[tuple[int, int, int]]:
    """``(block, slice, kv_id)`` of every layer's entry of every prompt block, in the order
    :func:`held_from_directory` wants their directory entries."""
    enc = p.encoder
    return [(b, s, enc.kv_id(layer, b, s)) for b in range(1, p.num_chunks + 1)
            for s in range(p.cluster.nodes) for layer in range(p.model.layers)]


def held_from_directory(p, entries: Iterable[dict[str, int]]) -> dict[str, list]:
    """The prompt's ``(block, slice)`` KV a node holds, from its directory entries
    (``DIR_ENTRY`` unpacked after ``DIR_PEEK`` of each :func:`directory_ids` id, in order):
    ``owned`` (state OWNER on every layer) and ``replicas`` (any layer VALID or DRAINING, or
    landed packets not owned)."""
    L = p.model.layers
    ids = directory_ids(p)
    entries = list(entries)
    assert len(entries) == len(ids), (len(entries), len(ids))
    owned, replicas = [], []
    for at in range(0, len(ids), L):
        b, s, _ = ids[at]
        states = [(DirState(e["state"]), e["landed"]) for e in entries[at: at + L]]
        if all(st is DirState.OWNER for st, _ in states):
            owned.append((b, s))
        elif any(st is not DirState.ABSENT or landed for st, landed in states):
            replicas.append((b, s))
    return {"owned": owned, "replicas": replicas}


def link_counter_names(regmap) -> list[str]:
    """The link receivers' counters (``link<l>_rx_*``) :func:`link_faults` reads."""
    return [reg.name for _, reg in regmap if reg.name.startswith("link")
            and "_rx_" in reg.name and reg.name.split("_rx_")[0][4:].isdigit()]


def link_faults(values: dict[str, int]) -> list[str]:
    """One phrase per link whose receiver counted an error (``values``: its
    :func:`link_counter_names` counters; ``[]``: none), e.g. ``link 1: crc_errors 1``."""
    out = []
    for ln in sorted({int(n.split("_rx_")[0][4:]) for n in values}):
        pre = f"link{ln}_rx_"
        bad = {n[len(pre):]: v for n, v in values.items()
               if n.startswith(pre) and v and not n.endswith("frames_ok")}
        if bad:
            out.append(f"link {ln}: " + ", ".join(f"{k} {v}" for k, v in bad.items()))
    return out
