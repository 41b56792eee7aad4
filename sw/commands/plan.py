"""``mcf plan``: a MARS prefill plan (paper §4) — replica factors, placement, memory per node,
traffic and the chunk-level cost model — or one of the baselines, as a table or ``--json``."""

from __future__ import annotations

import json
import math

from ..abi.node_config import NODE_CONFIGS
from ..abi.platform import ACLK_HZ, K26
from ..cli import UsageError
from ._checks import add_alias, description, spelling, writable_dir, writable_file

FLOAT_ARGS = ("kv_budget_mib", "buffer_mib", "alpha", "link_gbps", "link_latency_us", "mhz",
              "compute_eff", "gamma")
DEFAULT_NODE_CONFIG = "kr260"

PROGRESS_MIN_CHUNKS = 64


def _dims(text: str | None):
    if text is None:
        return None
    try:
        x, y = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--mesh-dims must look like 4x2, got {text!r}") from None
    return x, y


def run(args) -> int:
    from ..mars import POLICIES, PlanError, get_model, make_cluster, plan
    from ..mars.report import plan_dict, plan_table
    from ..mars.setting import SETTINGS, Setting, get_setting

    try:
        model = get_model(args.model, args.kv_dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.policy not in POLICIES:
        raise UsageError(f"unknown policy {args.policy!r} (one of {', '.join(POLICIES)})")
    if args.setting not in SETTINGS:
        raise UsageError(f"unknown setting {args.setting!r} (one of {', '.join(SETTINGS)})")
    if args.node_config not in NODE_CONFIGS:
        raise UsageError(f"unknown node configuration {args.node_config!r} "
                         f"(one of {', '.join(NODE_CONFIGS)})")
    _check_flags(args)
    for name in FLOAT_ARGS:
        if getattr(args, name) is not None and not math.isfinite(getattr(args, name)):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number")
    if args.nodes < 1:
        raise UsageError(f"--nodes must be >= 1 (got {args.nodes})")
    if args.seq_len < 1:
        raise UsageError(f"{spelling(args, 'seq_len', '--prompt-tokens')} must be >= 1 "
                         f"(got {args.seq_len})")
    if args.chunk is not None and (args.chunk < 1 or args.seq_len % args.chunk):
        raise UsageError(f"{spelling(args, 'seq_len', '--prompt-tokens')} {args.seq_len} is "
                         f"not a multiple of --chunk {args.chunk}")
    if args.emit_metadata:
        writable_dir("--emit-metadata", args.emit_metadata)
    if args.json not in (None, "-"):
        writable_file("--json", args.json)
    setting = get_setting(args.setting, model)
    if args.alpha is not None or args.kv_budget_mib is not None:
        setting = Setting("given", setting.alpha if args.alpha is None else args.alpha,
                          setting.kv_budget_mib if args.kv_budget_mib is None
                          else args.kv_budget_mib, f"flags over the {setting.name} setting")
    cfg = NODE_CONFIGS[args.node_config]
    try:
        cluster = make_cluster(
            args.nodes, setting.kv_budget_mib, node_config=cfg, buffer_mib=args.buffer_mib,
            topology=args.topology, link_gbps=args.link_gbps,
            link_latency_us=args.link_latency_us, mesh_dims=_dims(args.mesh_dims),
            dsps=args.dsps, clock_hz=args.mhz * 1e6, compute_eff=args.compute_eff,
            gamma=args.gamma, scope=args.scope,
            max_payload=cfg.max_payload if args.max_payload is None else args.max_payload,
            reduce_slots=cfg.reduce_slots if args.reduce_slots is None else args.reduce_slots)
        total = args.seq_len // args.chunk if args.chunk else 0
        progress = None
        if not args.json and not args.quiet and (total == 0 or total >= PROGRESS_MIN_CHUNKS):
            from tqdm import tqdm

            def progress(done, n, state={}):  # noqa: B006 - one bar per run
                if "bar" not in state and n >= PROGRESS_MIN_CHUNKS:
                    state["bar"] = tqdm(total=n, desc="planning chunks", unit="chunk",
                                        leave=False)
                if "bar" in state:
                    state["bar"].update(1)
                    if done == n:
                        state["bar"].close()
        p = plan(model, cluster, args.seq_len, args.chunk, args.policy, setting.alpha, progress,
                 keep_fetched=args.keep_fetched, bidirectional=not args.one_way)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if args.emit_metadata:
        files = p.write_metadata(args.emit_metadata)
        if not args.json:
            print(f"wrote {len(files)} files to {args.emit_metadata}")
    if args.json:
        text = json.dumps(plan_dict(p, args.detail) | {"setting": setting.__dict__})
        if args.json == "-":
            print(text)
        else:
            args.json_path.write_text(text + "\n")
    else:
        print(setting.describe())
        print(plan_table(p))
    return 0


UNIFORM_ONLY = (("--link-gbps", "link_gbps", 10.0), ("--link-latency-us", "link_latency_us", 2.0))
"""Flags of the uniform topologies (ring, mesh, torus, switch) with their defaults; the
kr260-* topologies use the board's own links."""


def _check_flags(args) -> None:
    """Flags that apply only with another flag, refused without it (issue #36)."""
    from pathlib import Path

    if args.seq_len is None:
        raise UsageError("--prompt-tokens N is required (the prompt length S in tokens)")
    if args.detail and not args.json:
        raise UsageError("--detail lists the transfers in the JSON: add --json")
    if args.mesh_dims is not None and args.topology not in ("mesh", "torus"):
        raise UsageError(f"--mesh-dims applies to --topology mesh or torus, not "
                         f"{args.topology}")
    if args.keep_fetched and args.policy != "mars":
        raise UsageError(f"--keep-fetched is a MARS option, not for --policy {args.policy}")
    for flag, attr, default in UNIFORM_ONLY:
        if getattr(args, attr) is None:
            setattr(args, attr, default)
        elif args.topology.startswith("kr260-"):
            raise UsageError(f"{flag} applies to the uniform topologies (ring, mesh, torus, "
                             f"switch); --topology {args.topology} uses the board's links")
    args.json_path = None if args.json in (None, "-") else Path(args.json)


def register(subs) -> None:
    p = subs.add_parser("plan", help="MARS prefill plan: replica factors, memory, traffic, TTFT",
                        description=description(__doc__))
    p.add_argument("--model", default="qwen2.5-1.5b", help="model preset (qwen2.5-1.5b, tiny)")
    p.add_argument("--kv-dtype", default=None, help="KV element type: int4, int8 or fp16")
    p.add_argument("--prompt-tokens", dest="seq_len", type=int, default=None, metavar="N",
                   help="prompt length S in tokens (required; formerly --seq-len)")
    add_alias(p, "--seq-len", "seq_len", type=int, metavar="N")
    p.add_argument("--nodes", type=int, required=True, help="number of nodes N")
    p.add_argument("--chunk", type=int, default=None,
                   help="chunk size B in tokens (default: B* by eq 8)")
    p.add_argument("--setting", default="paper",
                   help="alpha and S_node: paper (0.5, 64 MiB; default) or board (the KR260's "
                        "DDR after the weights)")
    p.add_argument("--kv-budget-mib", type=float, default=None,
                   help="per-node KV budget S_node in MiB (default: the setting's)")
    p.add_argument("--buffer-mib", type=float, default=8.0,
                   help="KV propagation buffer M_buf in MiB (eq 5)")
    p.add_argument("--alpha", type=float, default=None,
                   help="reuse aggressiveness (eq 15; default: the setting's)")
    p.add_argument("--policy", default="mars", help="mars, ring, zigzag, full or pd")
    p.add_argument("--node-config", default=DEFAULT_NODE_CONFIG,
                   help="node configuration whose reduction slots and payload limit the plan "
                        f"follows: {', '.join(NODE_CONFIGS)} (default {DEFAULT_NODE_CONFIG})")
    p.add_argument("--keep-fetched", action="store_true",
                   help="MARS: keep fetched blocks as replicas where the budget has room "
                        "(an extension; the paper replicates only on propagation)")
    p.add_argument("--one-way", action="store_true",
                   help="ring/zigzag/pd: stream history one way round the ring (default: both "
                        "ways on the full-duplex links)")
    p.add_argument("--topology", default="kr260-ring",
                   help="kr260-ring (default), kr260-switch, ring, mesh, torus or switch")
    p.add_argument("--mesh-dims", default=None, help="XxY for mesh/torus (default: squarest)")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="line rate of every link of a uniform topology (default 10)")
    p.add_argument("--link-latency-us", type=float, default=None,
                   help="per-hop latency of a uniform topology (default 2)")
    p.add_argument("--dsps", type=int, default=K26["DSP"],
                   help=f"DSP48E2 slices per node (default: the K26's {K26['DSP']})")
    p.add_argument("--mhz", type=float, default=ACLK_HZ / 1e6,
                   help="compute clock (default: the assumed aclk, mcf.abi.platform.ACLK_HZ)")
    p.add_argument("--compute-eff", type=float, default=1.0, help="achieved / peak compute")
    p.add_argument("--gamma", type=float, default=1.0, help="overlap safety factor (eq 8)")
    p.add_argument("--scope", default="model",
                   help="what T_comp (and TTFT) covers: model (default) or attention")
    p.add_argument("--max-payload", type=int, default=None,
                   help="largest packet payload in bytes (default and maximum: the node "
                        "configuration's)")
    p.add_argument("--reduce-slots", type=int, default=None,
                   help="open reductions per reduction engine (default and maximum: the node "
                        "configuration's reduce_slots)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="one JSON object instead of the table: printed, or written to PATH")
    p.add_argument("--detail", action="store_true",
                   help="with --json: list every transfer (source, destinations, route id)")
    p.add_argument("--emit-metadata", metavar="DIR", default=None,
                   help="write the packed per-node metadata streams and routes.json to DIR")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=run)
