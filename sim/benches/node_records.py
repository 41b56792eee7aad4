"""Random command-ring records for the ingress tests and bench (``mcf.abi.node.CMD``): well
formed, or broken in one of the ways :func:`mcf.abi.node.cmd_malformed` must catch. No cocotb
import here."""

from __future__ import annotations

import random

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import META, Meta, Op
from mcf.abi.node import CMD, CMD_FLAGS, Cmd, PayloadSource, Queue, RecordClass, cmd_malformed

__all__ = ["random_record"]


def random_record(rng: random.Random, queue: Queue, p_bad: float) -> int:
    """A well-formed record of ``queue``, or (with probability ``p_bad``) one broken in one of
    the ways the reader must catch."""
    classes = [c for c in RecordClass if queue is Queue.COMPUTE or c.value in (0, 1, 6, 7)]
    cls = rng.choice(classes)
    src = rng.choice(list(PayloadSource))
    length = 0 if src is PayloadSource.HDR else rng.randint(0, MAX_PAYLOAD)
    meta = Meta(op=rng.choice(list(Op)), kv_id=rng.getrandbits(16), length=length,
                seq=rng.getrandbits(8)).pack() if cls is RecordClass.SEND \
        else rng.getrandbits(64)
    raw = int.from_bytes(Cmd(cls, queue, meta=meta, src=src, irq=rng.random() < 0.3,
                             replicate=rng.random() < 0.3, wait=rng.getrandbits(20),
                             arg=rng.getrandbits(32)).pack(), "little")
    if rng.random() >= p_bad:
        return raw
    flags_lo = CMD["flags"].offset + CMD_FLAGS["reserved"].offset
    breakers = [
        lambda r: r | (8 << CMD["cls"].offset),
        lambda r: r ^ (1 << CMD["queue"].offset),
        lambda r: r | (rng.randint(1, 3) << flags_lo),
        lambda r: (r & ~(0xF << CMD["cls"].offset)) | (1 << CMD["cls"].offset)
        | (7 << META["op"].offset),
        lambda r: (r & ~((0x3FFF << META["length"].offset) | (0xF << CMD["cls"].offset)
                         | (7 << CMD["src"].offset)))
        | (1 << CMD["cls"].offset) | (1 << CMD["src"].offset)
        | (rng.randint(MAX_PAYLOAD + 1, 0x3FFF) << META["length"].offset),
        lambda r: (r & ~((0x3FFF << META["length"].offset) | (0xF << CMD["cls"].offset)
                         | (7 << CMD["src"].offset)))
        | (1 << CMD["cls"].offset) | (rng.randint(1, MAX_PAYLOAD) << META["length"].offset),
    ]
    if queue is Queue.NET:
        breakers.append(lambda r: (r & ~(0xF << CMD["cls"].offset))
                        | (rng.randint(2, 5) << CMD["cls"].offset))
    bad = rng.choice(breakers)(raw)
    assert cmd_malformed(bad, queue)
    return bad
