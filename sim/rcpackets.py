# Ref: IBTA Vol 1 Rel 1.4 ch. 9.2-9.5 (BTH, RETH, AETH, ImmDt, IETH, pad count); IBTA Vol 1
#      Annex A17 "RoCEv2" (UDP 4791, ICRC A17.8).
"""Between the RC reference model's packets (:class:`stellar.sim.rcmodel.Packet`) and Ethernet
frames, for testbenches that put the model and the gateware side by side.

``to_frame(pkt, dest_qp=...)`` builds a valid RoCEv2 frame (IPv4, UDP 4791) with
:func:`stellar.sim.packets.roce_frame`, which has scapy compute the ICRC. ``from_frame(frame)``
reads one back with the switch model's header walk and the shared header table, and checks the
ICRC against scapy's; it returns a :class:`Parsed` (the ``Packet``, destination QP, UDP source
port, ICRC verdict). ``fields(pkt)`` is what two packets must agree on to be "the same packet";
``show(pkt)`` prints one for logs.
"""

from typing import NamedTuple

from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.l2 import Ether
from stellar.hdl.net import headers as H

from .packets import roce_frame
from .rcmodel import Aeth, Packet, Reth
from .switch import walk
from .verbs import Opcode

__all__ = ["to_frame", "from_frame", "Parsed", "fields", "show", "icrc_ok"]


def to_frame(pkt, *, dest_qp, src_mac=0x02_00_00_00_00_C0, dst_mac=0x02_00_00_00_00_01,
             src_ip=0x0A_00_00_63, dst_ip=0x0A_00_00_01, udp_sport=0xC123, pad_count=None):
    """A RoCEv2 frame carrying ``pkt`` (its opcode, PSN, AckReq and the extension headers its
    opcode has: RETH, AETH, ImmDt, IETH; absent values are zero) to QP ``dest_qp``.
    ``pkt.payload`` must hold the bytes (not only ``src``)."""
    op = int(pkt.opcode)
    ext = {}
    names = {h.name for h in H.OPCODES[op].ext}
    if "reth" in names:
        r = pkt.reth or Reth(0, 0, 0)
        ext["reth"] = {"va": r.va, "rkey": r.rkey, "dma_length": r.dma_len}
    if "aeth" in names:
        a = pkt.aeth or Aeth(0, 0)
        ext["aeth"] = {"syndrome": a.syndrome, "msn": a.msn}
    if "immdt" in names:
        ext["immdt"] = {"data": pkt.imm or 0}
    if "ieth" in names:
        ext["ieth"] = {"rkey": pkt.ieth or 0}
    if pkt.length and len(pkt.payload) != pkt.length:
        raise ValueError(f"{pkt}: payload bytes not filled in")
    bth = {"dest_qp": dest_qp, "psn": pkt.psn, "ackreq": int(bool(pkt.ackreq))}
    if pad_count is not None:
        bth["pad_count"] = pad_count
    return roce_frame(op, payload=bytes(pkt.payload), bth=bth, ext=ext,
                      eth={"src": src_mac, "dst": dst_mac}, ip={"src": src_ip, "dst": dst_ip},
                      udp_sport=udp_sport)


class Parsed(NamedTuple):
    pkt: Packet          # ``qp`` = BTH destination QP
    dest_qp: int
    udp_sport: int
    icrc_ok: bool
    pad_count: int


def icrc_ok(frame, info=None):
    """The ICRC at the end of the IP packet equals the one scapy computes over it (A17.8)."""
    info = info or walk(frame)
    end = info.end
    q = Ether(bytes(frame[:end]))          # without the Ethernet padding
    if ScapyBTH not in q:
        return False
    return q[ScapyBTH].compute_icrc(b"") == bytes(frame[end - 4:end])


def from_frame(frame, *, check_icrc=True):
    """Parse a RoCEv2 RC frame into a model ``Packet`` (payload without pad). Raises
    ``ValueError`` when the frame is not RoCEv2 or its opcode is not an RC opcode."""
    frame = bytes(frame)
    info = walk(frame)
    if not info.roce:
        raise ValueError(f"not a RoCEv2 frame: {frame[:64].hex()}")
    bth = H.BTH.unpack(frame, info.bth)
    op = bth["opcode"]
    try:
        opcode = Opcode(op)
    except ValueError:
        raise ValueError(f"BTH opcode {op:#04x} is not an RC opcode the model knows") from None
    pos = info.bth + H.BTH.size
    pkt = Packet(opcode, bth["psn"], ackreq=bool(bth["ackreq"]), qp=bth["dest_qp"])
    for h in H.OPCODES[op].ext:
        v = h.unpack(frame, pos)
        pos += h.size
        if h is H.RETH:
            pkt.reth = Reth(v["va"], v["rkey"], v["dma_length"])
        elif h is H.AETH:
            pkt.aeth = Aeth(v["syndrome"], v["msn"])
        elif h is H.IMMDT:
            pkt.imm = v["data"]
        elif h is H.IETH:
            pkt.ieth = v["rkey"]
    end = info.end - 4                      # ICRC
    payload = frame[pos:end]
    pad = bth["pad_count"]
    if pad > len(payload):
        raise ValueError(f"{pkt}: pad count {pad} larger than the payload")
    pkt.payload = payload[:len(payload) - pad]
    udp = info.bth - H.UDP.size
    sport = int.from_bytes(frame[udp:udp + 2], "big")
    return Parsed(pkt, bth["dest_qp"], sport, icrc_ok(frame, info) if check_icrc else True, pad)


def fields(pkt):
    """What two packets must agree on: opcode, PSN, AckReq, RETH, AETH, ImmDt, IETH, payload
    (headers an opcode does not carry are None)."""
    op = Opcode(pkt.opcode)
    names = {h.name for h in H.OPCODES[int(op)].ext}
    return (op, pkt.psn, bool(pkt.ackreq),
            tuple(pkt.reth) if "reth" in names else None,
            tuple(pkt.aeth) if "aeth" in names else None,
            pkt.imm if "immdt" in names else None,
            pkt.ieth if "ieth" in names else None,
            bytes(pkt.payload))


def show(pkt):
    """One line: the model's ``str(pkt)`` plus RETH / ImmDt / IETH and the first payload bytes."""
    s = str(pkt)
    if pkt.reth is not None:
        s += f" reth(va={pkt.reth.va:#x} rkey={pkt.reth.rkey:#x} len={pkt.reth.dma_len})"
    if pkt.imm is not None:
        s += f" imm={pkt.imm:#x}"
    if pkt.ieth is not None:
        s += f" ieth={pkt.ieth:#x}"
    if pkt.payload:
        s += f" [{bytes(pkt.payload[:8]).hex()}..]"
    return s
