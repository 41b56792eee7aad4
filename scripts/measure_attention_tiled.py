"""Measurements behind docs/attention.md "Prefill on the arrays: formats" (issue #33 step 1):
the P·V probability format of prefill attention on the GEMM arrays, today's unpacked ``w``
(``PV_W``, 20 bits, one MAC per DSP48E2) against the 8-bit row-scaled ``P8`` (two MACs per
DSP48E2), with the tiled golden model :mod:`mcf.golden.attention_tiled`.

    OMP_NUM_THREADS=1 python scripts/measure_attention_tiled.py error
    OMP_NUM_THREADS=1 python scripts/measure_attention_tiled.py e2e
    python scripts/measure_attention_tiled.py dsp
    OMP_NUM_THREADS=1 python scripts/measure_attention_tiled.py retrieval --block-tokens 256 \\
        --lengths 1024 4094 --n 20

``error``: |o/l − float64| / max|v| over the same quantised inputs (GQA 6:1, head_dim 128, a
causal 64-token chunk at the end of 1,024 keys in blocks of ``--block``), per-token and
per-channel K, random and peaked queries, several seeds — max and mean per format, and the
error of ``P8`` against ``w`` (LSB of NORM_OUT).

``e2e``: relative L2 error against float64 attention on the unquantised data, with the INT4 KV
formats' own error (:func:`mcf.golden.kv_accuracy.kv_format_error`, mean over ``--seeds``).

``dsp``: DSP48E2 / LUT of the two P·V multiplier shapes (yosys, ``mcf.sim.synth.resources``).

``retrieval``: greedy exact-match accuracy of the retrieval checkpoint with the integer golden
model (:class:`mcf.golden.model.IntModel`, per-channel-K INT4 KV) whose prefill attention is the
tiled model in ``--p-format`` (``p8`` by default; ``w`` must give today's bits — ``--check-w``
compares the prompt logits of the first prompt with and without the tiled ``w`` path). Decode
attention is unchanged (two-phase). The model is patched in this process only;
``sw/golden/model.py`` is untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mcf.abi.fixed import FixedFormat  # noqa: E402
from mcf.abi.kv import KV_SCALE, dequantize_q  # noqa: E402
from mcf.abi.quant import ACT  # noqa: E402
from mcf.abi.softmax import NORM_OUT  # noqa: E402
from mcf.golden.attention import (  # noqa: E402
    KVChannelBlock,
    dequantize,
    dequantize_k,
    normalize_state,  # noqa: E402
    random_blocks,
    random_query,
)
from mcf.golden.attention_tiled import P_FORMATS, attend_tiled_rows  # noqa: E402


def float_rows(q, sq, blocks, q_pos):
    """float64 ``o/l`` per row on the quantised inputs (causal)."""
    qf = dequantize_q(q, sq)
    kf = np.concatenate([dequantize_k(b) for b in blocks])
    vf = np.concatenate([dequantize(b.v, b.sv, KV_SCALE) for b in blocks])
    pos = np.concatenate([np.asarray(b.pos) for b in blocks])
    t = qf @ kf.T / np.sqrt(qf.shape[1]) * np.log2(np.e)
    t = np.where(pos[None, :] <= np.asarray(q_pos)[:, None], t, -np.inf)
    p = np.exp2(t - t.max(axis=1, keepdims=True))
    return (p @ vf) / p.sum(axis=1, keepdims=True), np.abs(vf).max()


def channel_blocks(rng, lens, d, outliers: bool):
    """Per-channel-K blocks from ACT K/V rows (the on-chip quantiser), optional outlier
    channels and a K bias (the kv_accuracy data)."""
    out, pos = [], 0
    bias = rng.normal(0, 1, d) if outliers else np.zeros(d)
    for n in lens:
        kf = rng.normal(0, 1, (n, d)) + bias
        if outliers:
            kf[:, :4] *= 8
        vf = rng.normal(0, 1, (n, d))
        out.append(KVChannelBlock.quantize(ACT.quantize(kf), ACT.quantize(vf),
                                           np.arange(pos, pos + n)))
        pos += n
    return out


def case(kind: str, seed: int, block: int, keys: int = 1024, chunk: int = 64, heads: int = 6,
         d: int = 128):
    rng = np.random.default_rng(seed)
    lens = [block] * (keys // block) + ([keys % block] if keys % block else [])
    if kind.startswith("channel"):
        blocks = channel_blocks(rng, lens, d, outliers=kind.endswith("outliers"))
    else:
        blocks = random_blocks(rng, lens, d)
    pos = np.repeat(np.arange(keys - chunk, keys), heads)
    if kind.endswith("peaked"):
        from mcf.golden.attention import KVBlock
        allb = KVBlock.concat(blocks)
        qs = [random_query(rng, heads, d, peak=allb, peak_row=int(rng.integers(0, keys - chunk)))
              for _ in range(chunk)]
        q = np.concatenate([a for a, _ in qs])
        sq = np.concatenate([b for _, b in qs])
    else:
        q, sq = random_query(rng, chunk * heads, d)
    return q, sq, blocks, pos


FORMATS = {**P_FORMATS, "p7": FixedFormat("p7_int8", 7, 0, signed=False)}
"""The formats measured: ``p7`` is ``P8``'s rule with 0..127, what the arrays' signed INT8
activation port takes unchanged (measured only, not an ABI format)."""


def error(args) -> dict:
    res = {}
    for kind in ("token", "token_peaked", "channel", "channel_outliers"):
        acc = {f: [] for f in FORMATS}
        rel = {f: [] for f in FORMATS}
        diff = []
        for seed in range(args.seeds):
            q, sq, blocks, pos = case(kind, seed, args.block)
            ref, vmax = float_rows(q, sq, blocks, pos)
            outs = {}
            for name, fmt in FORMATS.items():
                st = attend_tiled_rows(q, sq, blocks, pos, p_format=fmt)
                outs[name] = normalize_state(st)
                err = NORM_OUT.to_float(outs[name]) - ref
                acc[name].append(np.abs(err) / vmax)
                rel[name].append(np.linalg.norm(err) / np.linalg.norm(ref))
            diff.append(np.abs(outs["p8"] - outs["w"]))
        row = {}
        for name in FORMATS:
            e = np.concatenate([a.ravel() for a in acc[name]])
            row[name] = {"max": float(e.max()), "mean": float(e.mean()),
                         "rel_l2": float(np.mean(rel[name]))}
        dd = np.concatenate([x.ravel() for x in diff])
        row["p8_vs_w_lsb"] = {"max": int(dd.max()), "mean": float(dd.mean())}
        res[kind] = row
        print(f"{kind:17s} " + "  ".join(
            f"{n}: max {row[n]['max']:.2e} mean {row[n]['mean']:.2e} relL2 {row[n]['rel_l2']:.2e}"
            for n in FORMATS) + f"  p8-w: max {dd.max()} LSB, mean {dd.mean():.2f}", flush=True)
    return res


def e2e(args) -> dict:
    """Relative L2 error against float64 attention on the **unquantised** Q/K/V
    (:func:`mcf.golden.kv_accuracy.kv_format_error`: ACT, the KV format's on-chip quantiser,
    the query quantiser), the attention computed by the tiled model in each P format."""
    import mcf.golden.kv_accuracy as ka
    from mcf.abi.kv_channel import KVFormat

    today = ka.attend_single
    res = {}
    try:
        for name, fmt in FORMATS.items():
            ka.attend_single = partial(_rows_single, p_format=fmt)
            for kvf in KVFormat:
                for outl in (False, True):
                    key = f"{kvf.name}/{'outliers' if outl else 'plain'}"
                    r = [ka.kv_format_error(kvf, outl, seed)["rel_l2"]
                         for seed in range(args.seeds)]
                    res.setdefault(key, {})[name] = float(np.mean(r))
    finally:
        ka.attend_single = today
    for key, row in res.items():
        print(f"{key:26s} " + "  ".join(f"{n}: {v:.4f}" for n, v in row.items()), flush=True)
    return res


def _rows_single(q, sq, blocks, p_format=None):
    return attend_tiled_rows(q, sq, blocks, 0, "single", causal=False, p_format=p_format)


def dsp(args) -> dict:
    """yosys ``synth_xilinx -family xcup`` (:func:`mcf.sim.synth.resources`) of ``--n``
    registered multipliers of each P·V operand shape: (a) ``w`` (PV_W, signed) × INT4 V, one MAC
    each; (b) the packed V pair ``v1·2^k + v0`` × ``w8`` zero-extended, two MACs each."""
    from amaranth import Module, Signal, signed
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from mcf.abi.attn_tile import P8, PV_SPLIT_KEYS, PV_W, pv_pack_shift
    from mcf.abi.kv import KV_ELEM
    from mcf.sim.synth import resources

    class Muls(wiring.Component):
        def __init__(self, aw, bw, n):
            self.n = n
            super().__init__({"a": In(signed(aw)).array(n), "b": In(signed(bw)).array(n),
                              "p": Out(signed(aw + bw)).array(n)})

        def elaborate(self, platform):
            m = Module()
            for i in range(self.n):
                a = Signal(self.a[i].shape())
                b = Signal(self.b[i].shape())
                m.d.sync += [a.eq(self.a[i]), b.eq(self.b[i]), self.p[i].eq(a * b)]
            return m

    k = pv_pack_shift(PV_SPLIT_KEYS)
    res = {"a_w_x_v": {"macs": args.n, **resources(Muls(PV_W.width + 1, KV_ELEM.width, args.n),
                                                   "pv_a")},
           "b_pair_x_p8": {"macs": 2 * args.n,
                           **resources(Muls(k + KV_ELEM.width + 1, P8.width + 1, args.n),
                                       "pv_b")}}
    for name, r in res.items():
        print(f"{name:12s} MACs {r['macs']:3d}: DSP {r['DSP']}, LUT {r['LUT']}, FF {r['FF']}")
    return res


def retrieval(args) -> dict:
    import mcf.golden.model as mg
    from mcf.abi.kv_channel import KVFormat
    from mcf.golden.attention_tiled import attend_prefill_tiled
    from mcf.model.checkpoint import RETRIEVAL_DIR, load_checkpoint
    from mcf.model.task import PASSKEY, accuracy, make_prompt

    cfg, tensors = load_checkpoint(RETRIEVAL_DIR)
    qm = mg.quantize_model(cfg, tensors)
    kvf = KVFormat.PER_CHANNEL_K if args.kv == "channel" else KVFormat.PER_TOKEN
    im = mg.IntModel(qm, block_tokens=args.block_tokens, kv_format=kvf)
    today = mg.attend_prefill
    tiled = partial(attend_prefill_tiled, p_format=P_FORMATS[args.p_format])
    out = {"p_format": args.p_format, "kv": args.kv, "block_tokens": args.block_tokens}
    if args.check_w:
        toks = make_prompt(args.lengths[0], 0).tokens
        a = im.generate(toks, 1).prompt_logits
        mg.attend_prefill = partial(attend_prefill_tiled, p_format=None)
        b = im.generate(toks, 1).prompt_logits
        out["w_bit_exact"] = bool(np.array_equal(a, b))
        print(f"tiled w == today's golden (prompt logits, {args.lengths[0]} tokens): "
              f"{out['w_bit_exact']}", flush=True)
    mg.attend_prefill = tiled
    for L in args.lengths:
        seeds = range(args.first_seed, args.first_seed + args.n)
        prompts = [make_prompt(L, s) for s in seeds]
        t0 = time.monotonic()
        preds = [im.generate(p.tokens, PASSKEY.value_len).tokens for p in prompts]
        wrong = [s for s, p, r in zip(seeds, prompts, preds) if not np.array_equal(r, p.answer)]
        a = accuracy(preds, [p.answer for p in prompts])
        out[str(L)] = {"accuracy": a, "prompts": args.n, "first_seed": args.first_seed,
                       "wrong_seeds": wrong,
                       "seconds_per_prompt": round((time.monotonic() - t0) / args.n, 2)}
        print(f"{L}: {100 * a:.1f} % of {args.n} (wrong seeds {wrong or '-'})", flush=True)
    mg.attend_prefill = today
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("error")
    e.add_argument("--seeds", type=int, default=4)
    e.add_argument("--block", type=int, default=256)
    x = sub.add_parser("e2e")
    x.add_argument("--seeds", type=int, default=3)
    y = sub.add_parser("dsp")
    y.add_argument("--n", type=int, default=16)
    r = sub.add_parser("retrieval")
    r.add_argument("--p-format", choices=tuple(P_FORMATS), default="p8")
    r.add_argument("--kv", choices=("channel", "token"), default="channel")
    r.add_argument("--block-tokens", type=int, default=256)
    r.add_argument("--lengths", type=int, nargs="+", default=[1024, 4094])
    r.add_argument("--n", type=int, default=20)
    r.add_argument("--first-seed", type=int, default=0, help="prompts first-seed .. +n-1")
    r.add_argument("--check-w", action="store_true")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    res = {"error": error, "e2e": e2e, "dsp": dsp, "retrieval": retrieval}[args.cmd](args)
    res["command"] = "python scripts/measure_attention_tiled.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
