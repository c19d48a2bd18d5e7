# Ref: IBTA Vol 1 Annex A17 (RoCEv2); field table in stellar.hdl.net.headers
"""Amaranth views of the header table: the stream beat, the header-metadata record, and the
gateware helpers that pack and unpack headers at byte offsets.

Byte vectors ("lanes") are little-endian in the lane sense: byte i of a vector is bits
[8i, 8i+8), the AXI-Stream convention, so byte 0 is the first byte on the wire. Header fields
are big-endian (network order); ``byteswap`` converts between the two.
"""

from amaranth.hdl import Cat, Const, Value
from amaranth.lib import data, enum

from . import headers as H

__all__ = ["Beat", "beat_layout", "DropReason", "record_layout", "RECORD_HEADERS",
           "byteswap", "pack_header", "unpack_header", "lane", "MAX_FRAME_BITS"]

# Frame lengths up to 16383 bytes (9000-byte jumbo frames with room to spare).
MAX_FRAME_BITS = 14


def beat_layout(data_width):
    """One stream beat: ``data`` (lanes), ``keep`` (one bit per byte), ``last``."""
    assert data_width % 8 == 0
    return data.StructLayout({
        "data": data_width,
        "keep": data_width // 8,
        "last": 1,
    })


Beat = beat_layout


class DropReason(enum.IntEnum, shape=3):
    """Why the parser marks a frame to be dropped; one reason per frame (the order of the checks
    that decides it is in ``stellar.hdl.net.parser``)."""
    NONE = 0
    ICRC = 1
    IP_CHECKSUM = 2
    MALFORMED = 3
    OPCODE = 4


# Headers whose every field is carried by the record (extension headers all present; those an
# opcode does not carry are zero).
RECORD_HEADERS = (H.ETH, H.VLAN, H.IPV4, H.IPV6, H.UDP, H.BTH) + H.EXT_HEADERS


def record_layout():
    """The header-metadata record: every field of every header, named ``<header>_<field>``,
    plus frame-level facts and the parser's verdict.

    Fields the deparser computes itself (ignored on its input): eth_ethertype, vlan_ethertype,
    ipv4_version, ipv4_total_length, ipv4_protocol, ipv4_checksum, ipv6_version,
    ipv6_payload_length, ipv6_next_header, udp_dport, udp_length, bth_pad_count.
    """
    fields = {}
    for h in RECORD_HEADERS:
        for f in h.fields:
            fields[f"{h.name}_{f.name}"] = f.width
    fields.update({
        "vlan": 1,              # an 802.1Q tag is present
        "ipv6": 1,              # IPv6 (else IPv4)
        "roce": 1,              # RoCEv2 frame (else passed through verbatim, fields undefined)
        "ipv4_options": H.MAX_IPV4_OPTIONS * 8,  # lanes; bytes past (ihl-5)*4 are zero
        "payload_len": MAX_FRAME_BITS,           # payload bytes, without pad and ICRC
        "frame_len": MAX_FRAME_BITS,             # bytes of the frame as received / emitted
        "drop": 1,              # parser verdict: discard this frame
        "reason": DropReason,
    })
    return data.StructLayout(fields)


def byteswap(value, nbytes):
    """Reverse the byte order of an ``nbytes``-byte value (lanes <-> big-endian integer)."""
    value = Value.cast(value)
    return Cat(*(value[(nbytes - 1 - i) * 8:(nbytes - i) * 8] for i in range(nbytes)))


def lane(vec, i):
    """Byte ``i`` of a lane vector."""
    return Value.cast(vec)[i * 8:(i + 1) * 8]


def pack_header(header, values):
    """Serialize a header to lanes from a mapping ``field name -> Value`` (missing = 0)."""
    be = Cat(*(_fit(values.get(f.name, 0), f.width) for f in reversed(header.fields)))
    return byteswap(be, header.size)


def _fit(value, width):
    """``value`` as exactly ``width`` bits (truncated or zero-extended)."""
    if isinstance(value, int):
        return Const(value & ((1 << width) - 1), width)
    value = Value.cast(value)
    if len(value) >= width:
        return value[:width]
    return Cat(value, Const(0, width - len(value)))


def unpack_header(header, lanes):
    """Field values (dict name -> Value slice) of a header given its lanes."""
    be = byteswap(lanes, header.size)
    bits = header.size * 8
    return {f.name: be[bits - f.first_bit - f.width:bits - f.first_bit] for f in header.fields}
