"""What every host of a cluster run computes before and while driving its node, whichever back
end drives it (simulated hosts, ``mcf.sim.benches.cluster_run``; PYNQ hosts,
:mod:`mcf.cluster.board`): the quantised model, MARS's plan, the golden run, each node's model
image at its buffer's address, every node's prefill programs, and the run's record."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..abi.node_config import NODE_CONFIGS, NodeConfig
from ..golden.cluster import ClusterGolden, GoldenRun
from .spec import RunSpec, make_plan, run_prompt

__all__ = ["RunSetup", "StepPrograms", "planned_receivers", "planned_landings", "run_record",
           "decode_held", "decode_result"]


@dataclass
class RunSetup:
    """The parts of a run that do not depend on where a node's memory is (:meth:`prepare`)."""
    spec: RunSpec
    model: object                 # mcf.model.Qwen2Config
    tensors: dict
    quantized: object             # mcf.golden.model.QuantModel
    plan: object
    config: NodeConfig
    golden: ClusterGolden
    prompt: np.ndarray
    answer: np.ndarray | None
    gold: GoldenRun
    xa: np.ndarray                # the prompt's embedding rows (ACT codes)
    decode_blocks: int            # decode KV blocks a node holds at most
    decode_held: int = 0          # decode tokens a node holds at most
    replicated: ClusterGolden | None = None   # --decode tp: the replicated root's golden too
    _decoded: dict = field(default_factory=dict)

    @classmethod
    def prepare(cls, spec: RunSpec) -> RunSetup:
        """Load and quantise ``spec``'s model, plan the run, compute the golden prefill."""
        from ..golden.model import quantize_model
        from ..model import model_from_spec
        from ..node.layer import prefill_tile_chunk

        mcfg, tensors = model_from_spec(spec.model, seed=spec.seed) if spec.model == "tiny" \
            else model_from_spec(spec.model)
        qm = quantize_model(mcfg, tensors)
        p = make_plan(spec, mcfg)
        blocks, held = decode_held(p, spec.decode_tokens)
        prompt, answer = run_prompt(spec, mcfg)
        replicated = None
        tiled = prefill_tile_chunk(NODE_CONFIGS[spec.config], spec.softmax) > 0
        if spec.decode == "tp":
            from ..golden.cluster import TPClusterGolden

            golden = TPClusterGolden(qm, p, spec.softmax, tiled=tiled)
            replicated = ClusterGolden(qm, p, spec.softmax, tiled=tiled)
            replicated.prefill(prompt)
        else:
            golden = ClusterGolden(qm, p, spec.softmax, tiled=tiled)
        return cls(spec, mcfg, tensors, qm, p, NODE_CONFIGS[spec.config], golden, prompt,
                   answer, golden.prefill(prompt), golden.embed(prompt), blocks, held,
                   replicated)

    @property
    def nodes(self) -> int:
        return self.spec.nodes

    def image(self, base: int, cmd_log2: int = 10):
        """The node image (:class:`mcf.node.head.HeadImage`: the decode image plus the LM head)
        of a node whose buffer starts at bus address ``base``; it ends at ``image.alloc.at``."""
        from ..node.decode import decode_layout, slice_tokens
        from ..node.head import HeadImage
        from ..node.layer import max_read_set, prefill_tile_chunk
        from ..node.layout import NodeLayout

        p, cfg, qm = self.plan, self.config, self.quantized
        lay0 = NodeLayout.for_plan(p, cfg, base=base, cmd_log2=cmd_log2)
        lay = decode_layout(p, cfg, lay0.base, lay0.cmd_log2, decode_blocks=self.decode_blocks,
                            held=self.decode_held)
        return HeadImage(self.model.layer, qm.layers, cfg, lay,
                         tokens=slice_tokens(p), decode_blocks=self.decode_blocks,
                         max_blocks=max_read_set(p), softmax=self.spec.softmax,
                         tile_chunk=prefill_tile_chunk(cfg, self.spec.softmax),
                         lm_head=qm.lm_head, norm=qm.norm)

    def tp_image(self, image, node: int):
        """``node``'s :class:`mcf.node.tp_decode.TPDecodeImage` (``--decode tp``) above the
        node image ``image`` (:meth:`image`); it ends at ``.end``."""
        from ..golden.tp_decode import tp_split
        from ..node.layout import REGION_ALIGN
        from ..node.tp_decode import TPDecodeImage

        base = -(-image.alloc.at // REGION_ALIGN) * REGION_ALIGN
        return TPDecodeImage(image, tp_split(self.model.layer, self.nodes), node, base)

    def decode_gold(self, k: int) -> list:
        """The golden layers of decode token ``k`` (computed once). With ``--decode tp``, the
        TP golden's, checked equal to the replicated root's (every layer's output and
        attention rows and the new token's K/V; ``AssertionError``)."""
        if k not in self._decoded:
            layers = self.golden.decode_token(k)
            if self.replicated is not None:
                rep = self.replicated.decode_token(k)
                for li, (a, b) in enumerate(zip(layers, rep, strict=True)):
                    assert np.array_equal(a.y, b.y) and np.array_equal(a.att, b.att) and \
                        a.kv == b.kv, f"decode token {k} layer {li}: TP golden != replicated"
            self._decoded[k] = layers
        return self._decoded[k]

    def prompt_record(self, tokens: list[int]) -> dict:
        """The record's ``prompt`` and ``task`` (the task's answer against ``tokens``, the
        generated ones; ``None`` without a task)."""
        answer, n = self.answer, 0 if self.answer is None else len(self.answer)
        return {"prompt": self.prompt.tolist(),
                "task": None if answer is None else {
                    "name": self.spec.task, "answer": answer.tolist(),
                    "generated": tokens[:n], "correct": tokens[:n] == answer.tolist()}}

    def head_program(self, node: int, image) -> tuple[list, list]:
        """``(net, compute)`` records of the first token's head phase on ``node``, after the
        prefill: the node that computed the prompt's last row runs the LM head on it
        (:meth:`mcf.node.head.HeadImage.head_job`); every node ends both queues with a MARK
        (interrupt), as a prefill step does."""
        from ..abi.node import Cmd, Queue, RecordClass

        owner, row = self.last_row_owner()
        compute = [image.head_job(row)] if node == owner else []
        return ([Cmd(RecordClass.MARK, Queue.NET, irq=True)],
                compute + [Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True)])

    def first_logits(self, node: int, mem, image) -> list | None:
        """The logits of the prompt's last row, read from node ``node``'s DDR (``mem``, by bus
        address; ``image`` its node image) after its head phase (:meth:`head_program`) if
        ``node`` computed that row, else None."""
        owner, _ = self.last_row_owner()
        return image.read_logits(mem).tolist() if owner == node else None

    def decode_head(self, mem, image, tp=None) -> dict:
        """What a node's host reads from its DDR (``mem``) after a decode token's LM head:
        replicated decode (``tp`` None; at the root, whose program ends with the whole head)
        ``logits``, every logit; TP decode (``tp``: the node's
        :class:`~mcf.node.tp_decode.TPDecodeImage`, whose program ends with its slice of the
        head) ``rows`` ``[v0, v1)``, ``logits`` of those rows and ``pair``, the slice's
        (max logit, index) (:func:`mcf.golden.tp_decode.slice_argmax`)."""
        if tp is None:
            return {"logits": image.read_logits(mem).tolist()}
        from ..golden.tp_decode import slice_argmax

        logits = image.read_logits(mem, tp.vocab)
        return {"rows": list(tp.vocab), "logits": logits.tolist(),
                "pair": list(slice_argmax(logits, tp.vocab[0]))}

    def last_row_owner(self) -> tuple[int, int]:
        """``(node, row)``: who computed the prompt's last position, and its row in the
        slice."""
        from ..node.layer import slice_positions

        p = self.plan
        S = p.num_chunks * p.chunk
        for s in range(self.nodes):
            p0, n = slice_positions(p, p.num_chunks, s)
            if p0 <= S - 1 < p0 + n:
                return s, S - 1 - p0
        raise AssertionError("no slice holds the last position")


def decode_result(got: list) -> tuple[int, list, int, list]:
    """``(token, logits, cycles, node_cycles)`` of one decode token from every node's values
    ``got`` (by node; :meth:`RunSetup.decode_head` plus ``cycles``, the root's COMPUTE doorbell
    to the node's MARK; a node with nothing to report gives an empty value). Replicated decode:
    the root's logits, their argmax and the root's cycles. TP decode: the token is the largest
    of the nodes' ``pair`` values (:func:`mcf.golden.tp_decode.merge_argmax`, the first index on
    ties), the logits (for the record and its bit-exact check) the nodes' slices in row order,
    the cycles the last node's. ``node_cycles``: each node's cycles (None: it reported none)."""
    from ..golden.tp_decode import merge_argmax

    outs = [v for v in got if v]
    per = [v["cycles"] if v else None for v in got]
    if len(outs) == 1 and "pair" not in outs[0]:
        o = outs[0]
        return int(np.argmax(o["logits"])), o["logits"], o["cycles"], per
    outs.sort(key=lambda o: o["rows"][0])
    edges = [0] + [o["rows"][1] for o in outs]
    assert [o["rows"][0] for o in outs] == edges[:-1], \
        f"the nodes' logit slices {[o['rows'] for o in outs]} do not tile the vocabulary"
    logits = [x for o in outs for x in o["logits"]]
    return (merge_argmax([tuple(o["pair"]) for o in outs]), logits,
            max(o["cycles"] for o in outs), per)


def decode_held(p, decode_tokens: int) -> tuple[int, int]:
    """``(decode blocks, decode tokens)`` one node of plan ``p`` holds at most after
    ``decode_tokens`` decode tokens (KV-stationary: each at its root); at least one block."""
    from ..node.decode import slice_tokens

    held = [p.decode_owner(k) for k in range(decode_tokens)]
    most = max([0] + [held.count(v) for v in range(p.cluster.nodes)])
    return max(1, -(-most // slice_tokens(p))), most


@dataclass
class StepPrograms:
    """Every node's program of each prefill step (:func:`mcf.node.program.step_program`),
    computed once per step in step order: each starts where the node's NET records of the
    earlier steps end. ``image``: the model image the programs address (a host's own; the
    other nodes' programs are used for what they send, not where)."""
    setup: RunSetup
    image: object
    _retired: list[int] = field(default_factory=list)
    _programs: dict = field(default_factory=dict)

    def __call__(self, index: int) -> list:
        from ..node.program import step_program

        if index not in self._programs:
            n = self.setup.nodes
            self._retired = self._retired or [0] * n
            progs = [step_program(self.setup.plan, index, v, self._retired[v],
                                  model=self.image) for v in range(n)]
            for v, prog in enumerate(progs):
                self._retired[v] += len(prog.net)
            self._programs[index] = progs
        return self._programs[index]


def planned_receivers(p, index: int) -> dict[tuple, set[int]]:
    """``(source, block, slice, route) -> receivers`` of prefill step ``index``'s transfers."""
    out: dict[tuple, set[int]] = {}
    for t in p.steps[index - 1].transfers:
        out.setdefault((t.src, t.block, t.slice, t.route_id), set()).update(t.dests)
    return out


def planned_landings(p, index: int, progs: list, node: int, tokens: int) -> int:
    """Packets node ``node`` lands in prefill step ``index``: its EMIT's local copies and every
    KV send of ``progs`` (all nodes' programs of the step) routed to it."""
    enc = p.encoder
    count = p.model.layers * len(enc.fragments(tokens))
    receivers = planned_receivers(p, index)
    for prog in progs:
        for meta in prog.kv_sends:
            _, block, slice_ = enc.kv_key(meta.kv_id)
            count += node in receivers[(meta.src, block, slice_, meta.route_id)]
    return count


def run_record(setup: RunSetup, steps: list[list[dict]], tokens: list[int], logits: list,
               decode_cycles: list[int], head_cycles: int,
               decode_node_cycles: list | None = None) -> dict:
    """The run's record from every node's step values (``steps[i][v]``: ``t0``, ``t1``,
    ``wait``, ``owned``, ``replicas``, ``kv_bytes``), the logits the nodes' LM heads wrote
    (first token, then each decode token), the first token's head phase cycles and
    (``decode_node_cycles``, :func:`decode_result`) each decode token's cycles per node; checks the
    layout after the prefill, the logits bit for bit against the golden run's and the tokens
    (``AssertionError``)."""
    from ..node.layer import slice_positions

    p, n, spec, gold = setup.plan, setup.nodes, setup.spec, setup.gold
    owned = {v: sum(slice_positions(p, b, s)[1] for b, s in steps[-1][v]["owned"])
             for v in range(n)}
    owner_only = not any(st["replicas"] for st in steps[-1]) and sorted(
        tuple(x) for st in steps[-1] for x in st["owned"]) == sorted(
        (b, s) for b in range(1, p.num_chunks + 1) for s in range(n))
    assert owner_only, f"the KV layout after the prefill is not owner-only: {steps[-1]}"
    bad = [i for i, (a, b) in enumerate(zip(logits, gold.logits, strict=True))
           if not np.array_equal(np.asarray(a, dtype=np.int64), b)]
    assert not bad, f"the node's logits differ from the golden head's at tokens {bad}"
    assert tokens == gold.tokens, f"generated tokens {tokens}, golden {gold.tokens}"
    kv_bytes = [[st["kv_bytes"] for st in s] for s in steps]
    peak = max(max(b) for b in kv_bytes)
    span = [max(v["t1"] for v in s) - min(v["t0"] for v in s) for s in steps]
    return {
        "nodes": n, "policy": spec.policy, "tokens": tokens, "golden_tokens": gold.tokens,
        "roots": gold.roots, "prefill_step_cycles": span,
        "exposed_comm_cycles": [[v["wait"] for v in s] for s in steps],
        "ttft_cycles": sum(span), "head_cycles": head_cycles, "decode_cycles": decode_cycles,
        "decode_node_cycles": decode_node_cycles or [],
        "logits": logits,
        "owned_tokens": owned, "kv_bytes_per_step": kv_bytes, "peak_kv_bytes": peak,
        "kv_budget": spec.kv_budget, "planned_peak_kv_bytes": p.totals.peak_node_kv_bytes,
        "checks": {"bit_exact": True, "logits_bit_exact": True,
                   "tokens_match": tokens == gold.tokens,
                   "owner_only": owner_only, "memory_within_budget": peak <= spec.kv_budget},
    }
