# Ref: IBTA Vol 1 ch. 9.7 (RC), 9.9 (errors), 11.2 (verbs); rdma-core libibverbs/verbs.h (values)
"""Formats of the transport's host-facing interfaces, declared once (pure Python, no amaranth):
the work request and receive request the requester and responder take, and the completion
entry both produce, plus the protocol constants the transport and its models share.

Enumerations keep rdma-core's numeric values (``IBV_WR_*``, ``IBV_WC_*``) so a verbs
programmer reads them without a table. The tables list fields from the least significant bit
up, like every ``FieldTable``: ``pack`` gives the integer the gateware sees on the stream.
"""

import enum

from ..flow.fields import PSN_BITS, QPN_BITS, FieldTable

__all__ = [
    "WrOpcode", "WcOpcode", "WcStatus", "Syndrome", "NakCode", "RcOpcode",
    "WORK_REQUEST", "RECV_REQUEST", "COMPLETION", "INLINE_MAX", "RNR_TIMER_US",
    "rnr_ticks", "ack_syndrome", "rnr_syndrome", "nak_syndrome", "psn_diff", "psn_ahead",
    "PSN_MASK", "CNP_OPCODE",
]

PSN_MASK = (1 << PSN_BITS) - 1
INLINE_MAX = 32     # bytes of inline payload a work request carries


class WrOpcode(enum.IntEnum):
    """``enum ibv_wr_opcode`` (the ones the RC transport executes)."""
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    SEND_WITH_INV = 9

    @property
    def is_send(self):
        return self in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.SEND_WITH_INV)

    @property
    def is_write(self):
        return self in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)

    @property
    def is_read(self):
        return self is WrOpcode.RDMA_READ

    @property
    def has_imm(self):
        return self in (WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND_WITH_IMM)

    @property
    def consumes_recv(self):
        """The message consumes one receive WQE at the responder (SEND*, WRITE_WITH_IMM)."""
        return self.is_send or self is WrOpcode.RDMA_WRITE_WITH_IMM


class WcOpcode(enum.IntEnum):
    """``enum ibv_wc_opcode``."""
    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class WcStatus(enum.IntEnum):
    """``enum ibv_wc_status``."""
    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13


class RcOpcode(enum.IntEnum):
    """BTH opcodes of the reliable-connected transport (IBTA Table 38)."""
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


CNP_OPCODE = 0x81
"""BTH opcode of the RoCEv2 Congestion Notification Packet (IBTA Annex A17.9.3)."""


class Syndrome(enum.IntEnum):
    """AETH syndrome bits 7:5."""
    ACK = 0
    RNR_NAK = 1
    NAK = 3


class NakCode(enum.IntEnum):
    """AETH syndrome bits 4:0 of a NAK."""
    PSN_SEQ_ERR = 0
    INV_REQ = 1
    REM_ACCESS = 2
    REM_OP = 3


def ack_syndrome():
    """ACK; the credit field 0x1F says "no end-to-end credit count" (IBTA 9.7.7.2)."""
    return 0x1F


def rnr_syndrome(timer_code):
    return 0x20 | (timer_code & 0x1F)


def nak_syndrome(code):
    return 0x60 | (int(code) & 0x1F)


def psn_diff(a, b):
    """``(a - b) mod 2**24``."""
    return (a - b) & PSN_MASK


def psn_ahead(a, b):
    """``a`` is ahead of ``b`` in 24-bit sequence space (0 < a - b < 2**23)."""
    return 0 < psn_diff(a, b) < (1 << (PSN_BITS - 1))


# IBTA Table 45: RNR NAK timer field -> minimum delay before the requester retries.
RNR_TIMER_US = [655360.0, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
                2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
                163840, 245760, 327680, 491520]


def rnr_ticks(code, tick_us=4.096):
    """RNR delay of timer ``code`` in timer ticks (rounded up: never retry early)."""
    return -(-int(RNR_TIMER_US[code] * 1000) // int(tick_us * 1000))


WORK_REQUEST = FieldTable("work_request", [
    ("qp", 16, "QP index (the flow table's value for the local QP)"),
    ("opcode", 4, "WrOpcode (ibv_wr_opcode values)"),
    ("signaled", 1, "generate a completion on success (errors always complete)"),
    ("inline", 1, "payload is inline_data (length <= 32 bytes), not read from laddr"),
    ("wr_id", 64, "returned in the completion"),
    ("laddr", 64, "local bus address: payload source (SEND/WRITE) or READ destination"),
    ("length", 32, "message length in bytes"),
    ("raddr", 64, "remote virtual address (WRITE/READ RETH)"),
    ("rkey", 32, "remote key (WRITE/READ RETH)"),
    ("imm", 32, "immediate data (*_WITH_IMM) or the rkey to invalidate (SEND_WITH_INV)"),
    ("inline_data", INLINE_MAX * 8, "inline payload, byte 0 in bits 7:0"),
], "A send-queue work request, as the requester takes it on its work-request stream.")


RECV_REQUEST = FieldTable("recv_request", [
    ("qp", 16, "QP index"),
    ("wr_id", 64, "returned in the completion"),
    ("addr", 64, "bus address of the receive buffer"),
    ("length", 32, "receive buffer length in bytes"),
], "A receive-queue work request (one buffer for one incoming SEND / WRITE_WITH_IMM).")


COMPLETION = FieldTable("completion", [
    ("qp", 16, "QP index"),
    ("is_recv", 1, "1: receive completion; 0: send-queue completion"),
    ("status", 5, "WcStatus (ibv_wc_status values)"),
    ("opcode", 8, "WcOpcode (ibv_wc_opcode values)"),
    ("has_imm", 1, "imm holds immediate data (IBV_WC_WITH_IMM)"),
    ("has_inv", 1, "imm holds an invalidated rkey (IBV_WC_WITH_INV)"),
    ("wr_id", 64, "of the work request"),
    ("byte_len", 32, "bytes received (receive) or read (RDMA READ)"),
    ("imm", 32, "immediate data or invalidated rkey"),
    ("src_qpn", QPN_BITS, "remote QP number (receive completions)"),
], "A completion-queue entry (send and receive completions share the stream).")
