"""Flat, Xilinx-style top-level port names for a component (``s_axis_tdata``, ``m_axis_tready``…).

Inside the design every port keeps Amaranth's hierarchical names and stream payloads are
``data.StructLayout`` views. Only a top level — a cocotb bench, or the Verilog handed to Vivado —
needs flat AXI names so that cocotbext-axi's ``from_prefix`` and Vivado's interface inference
bind without glue. :class:`FlatTop` does that once, for any component:

* a stream port listed in ``axis`` becomes ``<prefix>_tvalid``/``_tready`` plus one signal per
  payload field: ``data → tdata``, ``keep → tkeep``, ``last → tlast``, ``meta → tuser``, any
  other field ``f → t<f>``; a payload that is not a struct becomes ``tdata``;
* every other port (and every member of a nested, non-stream interface) becomes one signal named
  by its path joined with ``_``, struct-shaped ports as one flat vector.

Clock and reset stay Amaranth's ``clk`` / ``rst`` (active high), unless ``clock`` / ``resetn``
name the AXI pair (``aclk`` / ``aresetn``): then the wrapper owns the ``sync`` domain, clocked by
``clock``, its reset the output of an :class:`amaranth.lib.cdc.ResetSynchronizer` of the
active-low ``resetn`` (asynchronous assertion, synchronous release after 2 ``clock`` edges) — the
ports Vivado's module reference associates with every AXI interface (docs/node.md §8, §10).
"""

from __future__ import annotations

from amaranth import (
    ClockDomain,
    ClockSignal,
    Elaboratable,
    Instance,
    Module,
    ResetSignal,
    Shape,
    Signal,
)
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import ResetSynchronizer

__all__ = ["FlatTop", "FlatInstance", "AXIS_FIELD_NAMES"]

AXIS_FIELD_NAMES = {"data": "tdata", "keep": "tkeep", "last": "tlast", "meta": "tuser"}


class _FlatPorts:
    """The flat ports of ``inner`` (a component): ``connections`` lists ``(flat signal, inner
    value, is_input)`` in member order, ``is_input`` from the outside's point of view."""

    def __init__(self, inner: wiring.Component, axis: dict[str, str] | None = None):
        self._axis = dict(axis or {})
        self.connections: list[tuple[Signal, object, bool]] = []
        for name, member in inner.signature.members.items():
            self._flatten(getattr(inner, name), member, [name], flipped=False)

    def _add(self, flat_name: str, inner_value, is_input: bool) -> None:
        sig = Signal(Shape.cast(inner_value.shape()).width if not isinstance(
            inner_value, data.View) else len(inner_value.as_value()), name=flat_name)
        self.connections.append((sig, inner_value, is_input))

    def _flatten(self, value, member, path, flipped):
        is_in = (member.flow == wiring.In) != flipped
        if member.is_port:
            self._add("_".join(path), value, is_in)
            return
        sig = member.signature
        if isinstance(sig, stream.Signature):
            prefix = self._axis.get(path[-1] if len(path) == 1 else "_".join(path),
                                    "_".join(path))
            self._add(f"{prefix}_tvalid", value.valid, is_in)
            self._add(f"{prefix}_tready", value.ready, not is_in)
            payload = value.payload
            if isinstance(payload, data.View) and isinstance(
                    payload.shape(), data.StructLayout):
                for fname, _ in payload.shape():
                    flat = AXIS_FIELD_NAMES.get(fname, f"t{fname}")
                    self._add(f"{prefix}_{flat}", payload[fname], is_in)
            else:
                self._add(f"{prefix}_tdata", payload, is_in)
            return
        for sub_name, sub_member in sig.members.items():
            self._flatten(getattr(value, sub_name), sub_member, [*path, sub_name],
                          flipped=flipped)  # member.signature is already flipped for In


class FlatTop(Elaboratable):
    """Wraps ``inner`` with flat port names. ``ports`` lists the top-level signals."""

    def __init__(self, inner: wiring.Component, axis: dict[str, str] | None = None, *,
                 clock: str | None = None, resetn: str | None = None):
        if (clock is None) != (resetn is None):
            raise ValueError("clock and resetn come together")
        self.inner = inner
        self.clock = Signal(name=clock) if clock else None
        self.resetn = Signal(name=resetn, init=1) if resetn else None
        self._axis = dict(axis or {})
        self._connections = _FlatPorts(inner, axis).connections
        self.ports: list[Signal] = [] if clock is None else [self.clock, self.resetn]
        self.ports += [sig for sig, _, _ in self._connections]
        if clock is not None:
            self._associate(clock, resetn)

    def _associate(self, clock: str, resetn: str) -> None:
        """Vivado's module-reference attributes: ``clock`` is the clock of every bus interface
        (each top-level interface member, by its flat prefix) and ``resetn`` its active-low
        reset, so the block design needs no manual association."""
        busif = [self._axis.get(name, name) for name, member in
                 self.inner.signature.members.items() if not member.is_port]
        self.clock.attrs["X_INTERFACE_INFO"] = f"xilinx.com:signal:clock:1.0 {clock} CLK"
        self.clock.attrs["X_INTERFACE_PARAMETER"] = (
            f"ASSOCIATED_BUSIF {':'.join(busif)}, ASSOCIATED_RESET {resetn}")
        self.resetn.attrs["X_INTERFACE_INFO"] = f"xilinx.com:signal:reset:1.0 {resetn} RST"
        self.resetn.attrs["X_INTERFACE_PARAMETER"] = "POLARITY ACTIVE_LOW"

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self.inner
        if self.clock is not None:
            m.domains.sync = sync = ClockDomain("sync", async_reset=True)
            m.d.comb += sync.clk.eq(self.clock)
            m.submodules.reset_sync = ResetSynchronizer(~self.resetn, domain="sync")
        for flat, inner_value, is_input in self._connections:
            if is_input:
                m.d.comb += inner_value.eq(flat)
            else:
                m.d.comb += flat.eq(inner_value)
        return m


class FlatInstance(wiring.Component):
    """A component of ``signature`` whose body is an ``Instance`` of the module ``module`` —
    the Verilog :class:`FlatTop` writes for a component of that signature (same ``axis``
    names; ``clock``/``resetn`` driven from this component's ``sync`` domain). A design that
    holds many copies of one large component (a cluster of node tops) refers to one module
    definition, which a simulator compiles once instead of once per copy."""

    def __init__(self, signature: wiring.Signature, module: str,
                 axis: dict[str, str] | None = None, *, clock: str = "aclk",
                 resetn: str = "aresetn"):
        self._module, self._axis = module, dict(axis or {})
        self._clock, self._resetn = clock, resetn
        super().__init__(signature)

    def elaborate(self, platform):
        m = Module()
        ports = {f"i_{self._clock}": ClockSignal(), f"i_{self._resetn}": ~ResetSignal()}
        for sig, inner, is_input in _FlatPorts(self, self._axis).connections:
            ports[f"{'i' if is_input else 'o'}_{sig.name}"] = (
                inner.as_value() if isinstance(inner, data.View) else inner)
        m.submodules.inst = Instance(self._module, **ports)
        return m
