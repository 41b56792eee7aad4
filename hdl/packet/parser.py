"""Packet parser and metadata decoder (paper §5, "The NIC datapath is metadata-driven").

Splits ``Packet = {Meta, Payload}`` back into metadata and payload, validates the whole packet,
and dispatches it to one NIC engine by walking :data:`mcf.abi.meta.DISPATCH_RULES` — the table
the golden model :func:`mcf.abi.meta.dispatch_port` walks too.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import PARSER_STATUS, DropCause
from mcf.abi.framing import MAX_PAYLOAD, beat_layout, parsed_layout, payload_beats
from mcf.abi.meta import DISPATCH_RULES, META, Port, ReduceOp

from ..stream import RegisterSlice
from .packet_buffer import PacketBuffer
from .stage import PacketStage

__all__ = ["Parser", "port_member_name"]
"""Default largest accepted payload in bytes (a parameter of :class:`Parser`)."""


def port_member_name(port: Port) -> str:
    """Name of the parser output for ``port``: ``o_forward``, ``o_all_to_all``, ..."""
    return f"o_{port.name.lower()}"


def _dispatch(m: Module, meta: data.View, local_id) -> Signal:
    """The port chosen by the first matching rule of DISPATCH_RULES (combinational)."""
    port = Signal(Port)
    raw = {name: meta[name].as_value() for name in ("op", "collective", "reduce_op")}
    conds = []
    for rule in DISPATCH_RULES:
        terms = []
        if rule.op is not None:
            terms.append(_any(raw["op"] == o.value for o in rule.op))
        if rule.collective is not None:
            terms.append(_any(raw["collective"] == c.value for c in rule.collective))
        if rule.reduce_op_not_none is not None:
            not_none = raw["reduce_op"] != ReduceOp.NONE.value
            terms.append(not_none if rule.reduce_op_not_none else ~not_none)
        if rule.dst_is_local is not None:
            local = meta.dst == local_id
            terms.append(local if rule.dst_is_local else ~local)
        cond = Const(1)
        for t in terms:
            cond = cond & t
        conds.append((cond, rule.port))
    for i, (cond, rule_port) in enumerate(conds):
        with (m.If if i == 0 else m.Elif)(cond):
            m.d.comb += port.eq(rule_port)
    return port


def _any(terms):
    """OR of a sequence of 1-bit terms."""
    out = Const(0)
    for t in terms:
        out = out | t
    return out


class Parser(PacketStage):
    """Store-and-forward packet parser, validator and dispatcher.

    Parameters
    ----------
    data_width : int
        Bits per beat: a power-of-two number of bytes (64, 128, ...); the metadata must fit in
        one beat.
    meta_layout : StructLayout
        Metadata layout (default :data:`mcf.abi.meta.META`). ``op``'s enum gives the valid op
        codes; ``dst``'s width gives the widths of ``local_id`` / ``num_nodes``.
    max_payload : int
        Largest accepted ``length`` in bytes (default :data:`mcf.abi.framing.MAX_PAYLOAD`);
        longer packets are dropped as OVERSIZE.
    buffer_depth : int or None
        Payload words in the store-and-forward buffer (default: two maximum-size packets, so one
        packet is received while the previous one is sent). At least one maximum packet.
    queue_depth : int
        Validated packets waiting for output (metadata queue entries).
    out_register : bool
        ``False`` (default): a ready slice before the outputs (``i``'s ready a flip-flop, no
        latency). ``True``: a full slice — the outputs' ``valid`` and payload start from
        flip-flops too (one port decode), so a consumer's arbitration does not reach back
        into the buffer's read side and length compare; +1 cycle of latency (the node top's
        parsers, docs/depth.md).

    Members
    -------
    i_packet : In(stream.Signature(beat_layout(data_width)))
        Packets in the wire format of :mod:`mcf.abi.framing`.
    o_forward, o_all_to_all, o_reduction, o_local, o_control : Out(stream.Signature(
            parsed_layout(data_width)))
        One output per :class:`~mcf.abi.meta.Port` member (named ``o_<member>``). Each beat
        carries the packet's metadata; ``keep`` is all ones except on the final beat
        (``keep_mask(length)``); a zero-length packet is one beat with ``keep == 0``, data 0.
        Data bytes outside ``keep`` are passed as received.
    local_id : In(width of dst), num_nodes : In(width of dst + 1)
        This node's id (dispatch rule ``dst_is_local``) and the cluster size.
    status : Out(PARSER_STATUS)
        ``rx_packets`` counts every packet that ended (``last``) on ``i_packet``; each packet
        is then counted in exactly one ``drop_<cause>`` counter or, once fully sent, in
        ``tx_<port>``. 32-bit, wrapping.

    Validation (a packet is dropped WHOLE, counted under the first cause in DropCause order)
    ----------------------------------------------------------------------------------------
    UNKNOWN_OP: op code not a member of the op enum. BAD_DST: ``dst >= num_nodes``. OVERSIZE:
    ``length > max_payload``. TRUNCATED: ``last`` before ``payload_beats(length)`` payload beats.
    BAD_LENGTH: a beat after the last expected one (payload longer than ``length``, including
    any payload beat of a zero-length packet), a non-final beat (header included) whose
    ``keep`` is not all ones, or a final beat whose ``keep`` is not ``keep_mask(length)``.

    Stream rules and timing
    -----------------------
    Store-and-forward: nothing of a packet leaves before its ``last`` beat has been checked,
    so a bad packet never leaks data. ``i_packet`` takes one beat per cycle (headers
    included) while the buffer and queue have room; dropped packets never stall later ones.
    Latency: the first output beat can transfer 2 cycles (3 with ``out_register``) after the
    packet's ``last`` input beat (any length). Outputs sustain one beat per cycle. Outputs
    share one head-of-line: the next packet waits until the current one has left through its
    port.
    """

    def __init__(self, data_width: int = 128, meta_layout: data.StructLayout = META, *,
                 max_payload: int = MAX_PAYLOAD, buffer_depth: int | None = None,
                 queue_depth: int = 16, out_register: bool = False):
        length_max = (1 << meta_layout["length"].width) - 1
        if not 0 <= max_payload <= length_max:
            raise ValueError(f"max_payload must be in 0..{length_max}")
        max_beats = max(1, payload_beats(max_payload, data_width))
        if buffer_depth is None:
            buffer_depth = 2 * max_beats
        if buffer_depth < max_beats:
            raise ValueError(f"buffer_depth {buffer_depth} cannot hold a {max_payload}-byte "
                             f"packet ({max_beats} beats)")
        if queue_depth < 4:
            raise ValueError("queue_depth must be at least 4")
        bpb = data_width // 8
        if bpb & (bpb - 1):
            raise ValueError("data_width must be a power-of-two number of bytes")
        if sorted(c.value for c in DropCause) != list(range(len(DropCause))):
            raise ValueError("DropCause values must be 0..n-1 (they index the flag vector)")
        self._max_payload = max_payload
        self._buffer_depth = buffer_depth
        self._queue_depth = queue_depth
        self._out_register = out_register
        node_bits = meta_layout["dst"].width
        members = {"i_packet": In(stream.Signature(beat_layout(data_width, meta_layout)))}
        for port in Port:
            members[port_member_name(port)] = Out(stream.Signature(
                parsed_layout(data_width, meta_layout)))
        members.update({
            "local_id": In(node_bits),
            "num_nodes": In(node_bits + 1),
            "status": Out(PARSER_STATUS),
        })
        super().__init__(data_width, meta_layout, members)

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def buffer_depth(self) -> int:
        return self._buffer_depth

    def output(self, port: Port) -> stream.Interface:
        return getattr(self, port_member_name(port))

    def elaborate(self, platform):
        m = Module()
        width = self._data_width
        bpb = width // 8
        lane_bits = (bpb - 1).bit_length()
        layout = self._meta_layout
        length_bits = layout["length"].width
        beats_shape = unsigned(max(1, length_bits - lane_bits + 1))
        all_keep = Const((1 << bpb) - 1, bpb)
        status = self.status

        m.submodules.buffer = buf = PacketBuffer(width, self._buffer_depth)
        entry = data.StructLayout({"meta": layout, "port": Port})
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(
            width=entry.size, depth=self._queue_depth)

        def beats_of(length):
            return length[lane_bits:] + (length[:lane_bits] != 0)

        def last_keep_of(length):
            rem = length[:lane_bits]
            return Mux(rem == 0, all_keep, ((Const(1, bpb + 1) << rem) - 1)[:bpb])

        # ---- input side: validate, write speculatively, commit or roll back -------------------
        inp = self.i_packet
        beat = inp.payload
        take = inp.valid & inp.ready

        in_payload = Signal()            # header seen, payload beats (or garbage) follow
        meta_r = Signal(layout)
        port_r = Signal(Port)
        nexp = Signal(beats_shape)       # payload beats the header announces
        cnt = Signal(beats_shape)        # payload beats seen, saturating at nexp
        keep_last = Signal(bpb)          # keep of the final payload beat
        store = Signal()                 # header valid: payload goes to the buffer
        flags = Signal(len(DropCause))   # causes found so far (bit = DropCause value)

        cause = {c: Signal(name=f"is_{c.name.lower()}") for c in DropCause}
        ends = Signal()                  # this beat ends a packet
        new_flags = Signal(len(DropCause))
        m.d.comb += new_flags.eq(Cat(*(cause[c] for c in sorted(DropCause,
                                                                 key=lambda c: c.value))))
        all_flags = Mux(in_payload, flags | new_flags, new_flags)   # this packet's causes

        # header decode (combinational, used on the header beat)
        head = data.View(layout, beat.data[:layout.size])
        op_shape = layout["op"].shape
        op_ok = _any(head.op.as_value() == o.value for o in op_shape)
        head_port = _dispatch(m, head, self.local_id)
        head_len = head.length

        expected = Signal()
        final_exp = Signal()
        m.d.comb += [
            expected.eq(cnt < nexp),
            final_exp.eq(cnt == nexp - 1),
        ]

        want_space = Signal()
        m.d.comb += [
            want_space.eq(in_payload & store & expected),
            inp.ready.eq(queue.w_stream.ready & (~want_space | buf.w_ready)),
            buf.w_data.eq(beat.data),
            buf.w_en.eq(take & want_space),
        ]

        with m.If(~in_payload):
            m.d.comb += [
                cause[DropCause.UNKNOWN_OP].eq(~op_ok),
                cause[DropCause.BAD_DST].eq(head.dst >= self.num_nodes),
                cause[DropCause.OVERSIZE].eq(head_len > self._max_payload),
                cause[DropCause.TRUNCATED].eq(beat.last & (head_len != 0)),
                cause[DropCause.BAD_LENGTH].eq(beat.keep != all_keep),
                ends.eq(beat.last),
            ]
            with m.If(take):
                m.d.sync += [
                    meta_r.eq(head.as_value()),
                    port_r.eq(head_port),
                    nexp.eq(beats_of(head_len)),
                    cnt.eq(0),
                    keep_last.eq(last_keep_of(head_len)),
                    store.eq(op_ok & (head.dst < self.num_nodes) &
                             (head_len <= self._max_payload) & (head_len != 0)),
                    flags.eq(new_flags),
                    in_payload.eq(~beat.last),
                ]
        with m.Else():
            keep_ok = beat.keep == Mux(final_exp, keep_last, all_keep)
            m.d.comb += [
                cause[DropCause.TRUNCATED].eq(beat.last & expected & ~final_exp),
                cause[DropCause.BAD_LENGTH].eq(~expected | ~keep_ok),
                ends.eq(beat.last),
            ]
            with m.If(take):
                m.d.sync += flags.eq(all_flags)
                with m.If(expected):
                    m.d.sync += cnt.eq(cnt + 1)
                with m.If(beat.last):
                    m.d.sync += in_payload.eq(0)

        good_end = Signal()
        m.d.comb += good_end.eq(take & ends & (all_flags == 0))
        m.d.comb += [
            buf.commit.eq(good_end),
            buf.rollback.eq(take & ends & (all_flags != 0)),
            queue.w_stream.valid.eq(good_end),
        ]
        q_in = data.View(entry, queue.w_stream.payload)
        with m.If(in_payload):
            m.d.comb += [q_in.meta.eq(meta_r), q_in.port.eq(port_r)]
        with m.Else():
            m.d.comb += [q_in.meta.eq(head.as_value()), q_in.port.eq(head_port)]

        with m.If(take & ends):
            m.d.sync += status.rx_packets.eq(status.rx_packets + 1)
            for c in DropCause:
                # exactly one counter: the first cause in DropCause order
                first = all_flags[c.value]
                if c.value:
                    first = first & ~all_flags[:c.value].any()
                counter = status[f"drop_{c.name.lower()}"]
                with m.If(first):
                    m.d.sync += counter.eq(counter + 1)

        # ---- output side: validated packets, one beat per cycle -------------------------------
        q_out = data.View(entry, queue.r_stream.payload)
        zero = q_out.meta.length == 0
        out_idx = Signal(beats_shape)
        is_last = Signal()
        m.d.comb += is_last.eq(zero | (out_idx == beats_of(q_out.meta.length) - 1))

        valid = queue.r_stream.valid & (zero | buf.r_stream.valid)
        # a ready slice between the buffer's read side and the outputs: the outputs' ready
        # (the node's arbiters and sinks) stops at a register instead of reaching the buffer's
        # read pointer and commit counter (docs/depth.md); no latency added. With
        # out_register a full slice: the outputs start from registers as well (+1 cycle)
        out_entry = data.StructLayout({"beat": parsed_layout(width, layout), "port": Port})
        m.submodules.out_slice = osl = RegisterSlice(out_entry, forward=self._out_register)
        sel_ready = osl.i.ready
        m.d.comb += [
            osl.i.valid.eq(valid),
            osl.i.payload.port.eq(q_out.port),
            osl.i.payload.beat.meta.eq(q_out.meta),
            osl.i.payload.beat.data.eq(Mux(zero, 0, buf.r_stream.payload)),
            osl.i.payload.beat.keep.eq(Mux(zero, 0, Mux(is_last, last_keep_of(q_out.meta.length),
                                                        all_keep))),
            osl.i.payload.beat.last.eq(is_last),
        ]
        out_ready = Signal()
        for port in Port:
            o = self.output(port)
            m.d.comb += [
                o.valid.eq(osl.o.valid & (osl.o.payload.port == port)),
                o.payload.eq(osl.o.payload.beat),
            ]
        with m.Switch(osl.o.payload.port):
            for port in Port:
                with m.Case(port):
                    m.d.comb += out_ready.eq(self.output(port).ready)
        m.d.comb += osl.o.ready.eq(out_ready)

        sent = valid & sel_ready
        m.d.comb += [
            buf.r_stream.ready.eq(queue.r_stream.valid & ~zero & sel_ready),
            queue.r_stream.ready.eq(sent & is_last),
        ]
        with m.If(sent):
            m.d.sync += out_idx.eq(Mux(is_last, 0, out_idx + 1))
        out_end = osl.o.valid & out_ready & osl.o.payload.beat.last
        with m.If(out_end), m.Switch(osl.o.payload.port):
            for port in Port:
                with m.Case(port):
                    counter = status[f"tx_{port.name.lower()}"]
                    m.d.sync += counter.eq(counter + 1)
        return m
