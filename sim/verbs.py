# Ref: IBTA Vol 1 Rel 1.4 ch. 9.2-9.5 (BTH opcodes, AETH syndrome), ch. 9.7 (RC PSNs, RNR NAK
#      timer table 9.7.5.2.8), ch. 11.4 (work requests and completions);
#      rdma-core libibverbs/verbs.h (ibv_wr_opcode, ibv_wc_opcode, ibv_wc_status, ibv_qp_state).
"""Verbs-level types shared by the testbenches, the RC reference model and the scoreboard.

Pure Python. Enumerations keep the numeric values of rdma-core's ``verbs.h`` so a verbs
programmer reads them without a table; the BTH opcodes and AETH syndromes are the RC subset the
transport contract (``rcspec``) names. PSN arithmetic is 24-bit and modular everywhere::

    psn_diff(a, b)  = (a - b) mod 2**24
    psn_ahead(a, b) = 0 < psn_diff(a, b) < 2**23      # a is later than b
    psn_behind(a, b) = psn_diff(a, b) >= 2**23        # a is earlier than b

A work request names memory by *local bus address* (``laddr``), the address the NIC's DMA engine
uses; remote addresses (``raddr``) are the peer's RETH virtual addresses.
"""

import enum
from dataclasses import dataclass
from typing import NamedTuple

from stellar.hdl.flow import fields
from stellar.hdl.transport import formats

__all__ = [
    "PSN_BITS", "PSN_MOD", "MAX_INLINE",
    "WrOpcode", "WcOpcode", "WcStatus", "QpState", "Opcode", "AckType", "NakCode",
    "WorkRequest", "RecvRequest", "Completion", "Syndrome",
    "ack_syndrome", "rnr_syndrome", "nak_syndrome", "decode_syndrome",
    "psn_diff", "psn_add", "psn_ahead", "psn_behind", "mtu_bytes", "packets",
    "RNR_TIMER_US", "ack_timeout_us", "wc_opcode",
]

PSN_BITS = 24
PSN_MOD = 1 << PSN_BITS
MAX_INLINE = 32     # bytes of inline data a work request may carry


# One source of truth: the enums the gateware's formats use (rdma-core values).
WrOpcode = formats.WrOpcode
WcOpcode = formats.WcOpcode
WcStatus = formats.WcStatus
QpState = fields.QpState


def wc_opcode(op):
    """The send-queue completion opcode of a work request opcode."""
    op = WrOpcode(op)
    if op.is_send:
        return WcOpcode.SEND
    if op.is_write:
        return WcOpcode.RDMA_WRITE
    return WcOpcode.RDMA_READ


class Opcode(enum.IntEnum):
    """BTH opcodes of the RC transport (IBTA Vol 1 table 35, transport 000)."""
    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_IMM = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_IMM = 0x05
    WRITE_FIRST = 0x06
    WRITE_MIDDLE = 0x07
    WRITE_LAST = 0x08
    WRITE_LAST_IMM = 0x09
    WRITE_ONLY = 0x0A
    WRITE_ONLY_IMM = 0x0B
    READ_REQUEST = 0x0C
    READ_RESP_FIRST = 0x0D
    READ_RESP_MIDDLE = 0x0E
    READ_RESP_LAST = 0x0F
    READ_RESP_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    SEND_LAST_INV = 0x16
    SEND_ONLY_INV = 0x17

    # Position of the packet in its message and what it is. Spelled out as sets rather than
    # derived from bit patterns so a reader can check them against the table at a glance.
    @property
    def is_send(self):
        return self in _SEND

    @property
    def is_write(self):
        return self in _WRITE

    @property
    def is_request(self):
        return self in _SEND or self in _WRITE or self is Opcode.READ_REQUEST

    @property
    def is_read_response(self):
        return self in _READ_RESP

    @property
    def is_first(self):
        return self in (Opcode.SEND_FIRST, Opcode.WRITE_FIRST, Opcode.READ_RESP_FIRST)

    @property
    def is_middle(self):
        return self in (Opcode.SEND_MIDDLE, Opcode.WRITE_MIDDLE, Opcode.READ_RESP_MIDDLE)

    @property
    def is_last(self):
        return self in (Opcode.SEND_LAST, Opcode.SEND_LAST_IMM, Opcode.SEND_LAST_INV,
                        Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM, Opcode.READ_RESP_LAST)

    @property
    def is_only(self):
        return self in (Opcode.SEND_ONLY, Opcode.SEND_ONLY_IMM, Opcode.SEND_ONLY_INV,
                        Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM, Opcode.READ_RESP_ONLY)

    @property
    def has_imm(self):
        return self in (Opcode.SEND_LAST_IMM, Opcode.SEND_ONLY_IMM, Opcode.WRITE_LAST_IMM,
                        Opcode.WRITE_ONLY_IMM)

    @property
    def has_ieth(self):
        return self in (Opcode.SEND_LAST_INV, Opcode.SEND_ONLY_INV)

    @property
    def has_reth(self):
        return self in (Opcode.WRITE_FIRST, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM,
                        Opcode.READ_REQUEST)

    @property
    def has_aeth(self):
        return self in (Opcode.ACKNOWLEDGE, Opcode.READ_RESP_FIRST, Opcode.READ_RESP_LAST,
                        Opcode.READ_RESP_ONLY)


_SEND = frozenset({Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST, Opcode.SEND_LAST_IMM,
                   Opcode.SEND_ONLY, Opcode.SEND_ONLY_IMM, Opcode.SEND_LAST_INV,
                   Opcode.SEND_ONLY_INV})
_WRITE = frozenset({Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST,
                    Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM})
_READ_RESP = frozenset({Opcode.READ_RESP_FIRST, Opcode.READ_RESP_MIDDLE, Opcode.READ_RESP_LAST,
                        Opcode.READ_RESP_ONLY})


# --- AETH syndrome -------------------------------------------------------------------------------
# Bits 6:5 say what it is (00 ACK, 01 RNR NAK, 11 NAK, 10 reserved), bits 4:0 the value (ACK:
# credit count, 0x1F = "not used", which is all an RC responder without end-to-end credits sends;
# RNR NAK: timer code; NAK: NAK code). Bit 7 is reserved (0).

class AckType(enum.IntEnum):
    ACK = 0
    RNR = 1
    RESERVED = 2
    NAK = 3


class NakCode(enum.IntEnum):
    PSN_SEQ_ERR = 0
    INV_REQ = 1
    REM_ACCESS = 2
    REM_OP = 3


class Syndrome(NamedTuple):
    kind: AckType
    value: int          # ACK: credit count; RNR: timer code; NAK: NakCode value


def ack_syndrome():
    return 0x1F


def rnr_syndrome(code):
    assert 0 <= code < 32
    return 0x20 | code


def nak_syndrome(code):
    assert 0 <= code < 32
    return 0x60 | int(code)


def decode_syndrome(s):
    """``Syndrome(kind, value)`` of an AETH syndrome byte (kind RESERVED for 010xxxxx and for any
    value with bit 7 set)."""
    if s & 0x80:
        return Syndrome(AckType.RESERVED, s & 0x1F)
    kind = AckType((s >> 5) & 3)
    value = s & 0x1F
    if kind is AckType.NAK and value in NakCode._value2member_map_:
        value = NakCode(value)
    return Syndrome(kind, value)


# --- PSN arithmetic ------------------------------------------------------------------------------

def psn_diff(a, b):
    """``(a - b) mod 2**24``: how far ``a`` is past ``b``."""
    return (a - b) % PSN_MOD


def psn_add(a, n):
    return (a + n) % PSN_MOD


def psn_ahead(a, b):
    """``a`` is later than ``b`` (less than half the PSN space ahead)."""
    return 0 < psn_diff(a, b) < PSN_MOD // 2


def psn_behind(a, b):
    """``a`` is earlier than ``b``."""
    return psn_diff(a, b) >= PSN_MOD // 2


# --- sizes and timers ----------------------------------------------------------------------------

def mtu_bytes(code):
    """Path MTU code (``ibv_mtu``, 1..5) -> bytes (256..4096)."""
    if not 1 <= code <= 5:
        raise ValueError(f"path MTU code {code} is not 1..5 (256..4096 bytes)")
    return 256 << (code - 1)


def packets(length, mtu):
    """Packets of a message of ``length`` bytes: ``max(1, ceil(length / mtu))`` (a zero-length
    message is one packet without payload)."""
    return max(1, -(-length // mtu))


# IBTA Vol 1 table 45 "Encoding for RNR NAK Timer Field", in microseconds (code 0 is the longest).
RNR_TIMER_US = (
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
    2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840,
    245760, 327680, 491520,
)


def ack_timeout_us(timeout):
    """Local ACK timeout in microseconds, ``4.096 us * 2**timeout``; None for 0 (infinite: the
    timer is never armed)."""
    if timeout == 0:
        return None
    return 4.096 * (1 << timeout)


# --- work requests and completions ---------------------------------------------------------------

@dataclass
class WorkRequest:
    """A send-queue work request (``ibv_send_wr`` reduced to one SGE).

    ``qp`` is the local QP index, ``laddr``/``length`` the local buffer (bus address): the
    payload of SEND/WRITE, the destination of READ. ``inline`` bytes (at most 32) replace
    ``laddr``/``length`` for SEND/WRITE. ``raddr``/``rkey`` name the remote buffer of WRITE/READ;
    ``imm`` travels with the *_WITH_IMM opcodes, ``invalidate_rkey`` with SEND_WITH_INV."""
    qp: int
    wr_id: int
    opcode: WrOpcode
    laddr: int = 0
    length: int = 0
    raddr: int = 0
    rkey: int = 0
    imm: int = 0
    inline: "bytes | None" = None
    invalidate_rkey: int = 0
    signaled: bool = True

    def __post_init__(self):
        self.opcode = WrOpcode(self.opcode)
        if self.inline is not None:
            if len(self.inline) > MAX_INLINE:
                raise ValueError(f"wr_id {self.wr_id:#x}: {len(self.inline)} inline bytes, at most "
                                 f"{MAX_INLINE}")
            if self.opcode.is_read:
                raise ValueError(f"wr_id {self.wr_id:#x}: RDMA_READ cannot carry inline data")
            self.inline = bytes(self.inline)

    @property
    def size(self):
        """Message length in bytes."""
        return len(self.inline) if self.inline is not None else self.length


@dataclass
class RecvRequest:
    """A receive-queue work request: one buffer at bus address ``addr``."""
    qp: int
    wr_id: int
    addr: int
    length: int


@dataclass
class Completion:
    """A work completion (``ibv_wc`` reduced). ``qp`` is the local QP index; ``is_recv`` tells
    receive-queue completions from send-queue ones. For error statuses only ``wr_id`` and
    ``status`` are meaningful (as in verbs)."""
    qp: int
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int = 0
    imm: "int | None" = None
    invalidated_rkey: "int | None" = None
    is_recv: bool = False
