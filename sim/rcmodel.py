# Ref: IBTA Vol 1 Rel 1.4 ch. 9.7 (RC: PSNs, ACK/NAK, duplicates, go-back-N, RNR), ch. 9.9
#      (error classes); Annex A17 (RoCEv2); Stellar's transport contract "rcspec" (PSN semantics
#      shared by the RTL and this model).
"""Packet-level reference model of the RC transport: what the responder and the requester of
one QP do with every packet, written as plainly as the contract reads.

Pure Python, independent of the gateware. Two classes, one per role of a QP:

``ResponderModel``  takes request packets (SEND*, WRITE*, READ_REQUEST) and says what they
                    cause: memory writes, receive completions, ACK/NAK/RNR NAK, READ responses.
``RequesterModel``  turns posted work requests into request packets (segmentation by path MTU,
                    PSNs, AckReq, outstanding window) and takes ACKs, NAKs and READ responses
                    (completions, READ data, go-back-N, local ACK timer, retry counts).

Neither has a clock: the caller decides when the requester's timer expires (``timeout()``,
``rnr_expired()``), reading ``timer_kind``/``timer_us`` and ``timer_starts`` (bumped every time
the timer is started or restarted) to schedule it. Neither touches memory: outputs say "write
these bytes there" (:class:`MemWrite`); ``apply_writes`` applies them to a memory object. The
requester reads payload from its memory at send time when one is given (``mem=``), as a DMA
engine would; else packets carry only ``src = (bus address, length)``.

``PairSim`` at the bottom runs two model NICs against each other over a seeded lossy channel
(drop, duplicate, reorder) in simulated time: the end-to-end reference the tests and the
scoreboard use.

Choices where the contract is silent (IBTA is followed):
* An AETH-carrying packet (ACK, NAK, RNR NAK, READ response) whose PSN is not outstanding
  (``psn_diff(p, una) >= psn_diff(npsn, una)``) is a ghost and ignored, for every kind, not
  only ACKs (a stale NAK after go-back-N would otherwise rewind twice, a stale READ response
  would move ``una`` past ``npsn``).
* READ response positions (FIRST/MIDDLE/LAST/ONLY) are counted from the PSN of the READ
  request last sent for the WQE: after go-back-N inside a READ, the re-sent request asks for
  the rest, and the responder, for which it is a request of its own, answers with a new FIRST
  (IBTA 9.7.5: a retried RDMA READ restarts at the first unacknowledged PSN).
* WRITE payloads must add up to the RETH DMA length (IBTA 9.7.4 length checks; rdma-core's rxe
  does the same): FIRST and MIDDLE need more than one MTU left, LAST and ONLY carry exactly
  what is left; otherwise NAK invalid request. This keeps every byte inside the range the
  memory-region check approved.
* Go-back-N (rewind) disarms the ACK timer (nothing is outstanding right after it); the first
  re-sent packet arms it again.
* A fatal error completes the failing WQE with its status and every other WQE still queued with
  WR_FLUSH_ERR, in WQE order.
* After a SEND longer than its receive buffer (LOC_LEN_ERR), the receive WQE is retired; later
  in-sequence packets of that message find no buffer and get NAK invalid request again.
* While an RNR wait runs, progress (una advancing) leaves the RNR timer alone.
* Successful send-queue completions carry ``byte_len`` = message length (as rxe does; verbs
  defines it only for READ). Reserved NAK codes (4..31) complete as REM_OP_ERR.
"""

import enum
import heapq
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import NamedTuple

from .verbs import (
    PSN_MOD,
    RNR_TIMER_US,
    AckType,
    Completion,
    NakCode,
    Opcode,
    QpState,
    RecvRequest,
    WcOpcode,
    WcStatus,
    WorkRequest,
    WrOpcode,
    ack_syndrome,
    ack_timeout_us,
    decode_syndrome,
    mtu_bytes,
    nak_syndrome,
    packets,
    psn_add,
    psn_ahead,
    psn_behind,
    psn_diff,
    rnr_syndrome,
    wc_opcode,
)

__all__ = [
    "Reth", "Aeth", "Packet", "Ack", "MemWrite", "ReadResponse", "InMsg",
    "ResponderModel", "RequesterModel", "read_response_packets", "response_packets",
    "apply_writes", "LossyChannel", "PairSim",
]


# --- packets and outputs -------------------------------------------------------------------------

class Reth(NamedTuple):
    va: int
    rkey: int
    dma_len: int


class Aeth(NamedTuple):
    syndrome: int
    msn: int


@dataclass
class Packet:
    """One RC packet as the transport sees it (headers below BTH are not modelled).

    ``payload`` holds the bytes; a requester without a memory leaves it empty and says where the
    bytes come from in ``src = (local bus address, length)``. ``qp`` is the destination QP (index
    or number, as the caller uses it)."""
    opcode: Opcode
    psn: int
    ackreq: bool = False
    qp: int = 0
    payload: bytes = b""
    src: "tuple[int, int] | None" = None
    reth: "Reth | None" = None
    imm: "int | None" = None
    ieth: "int | None" = None
    aeth: "Aeth | None" = None

    @property
    def dest_qp(self):
        return self.qp

    @property
    def length(self):
        """Payload bytes (from ``src`` when the bytes themselves were not filled in)."""
        return self.src[1] if self.src is not None else len(self.payload)

    def __str__(self):
        s = f"{Opcode(self.opcode).name} psn {self.psn:#08x}"
        if self.ackreq:
            s += " A"
        if self.length:
            s += f" {self.length}B"
        if self.aeth is not None:
            k = decode_syndrome(self.aeth.syndrome)
            s += f" {k.kind.name}({int(k.value)}) msn {self.aeth.msn}"
        return s


@dataclass(frozen=True)
class Ack:
    """Responder output: an ACKNOWLEDGE packet carrying ``syndrome`` (ACK, NAK or RNR NAK)."""
    psn: int
    syndrome: int
    msn: int

    @property
    def kind(self):
        return decode_syndrome(self.syndrome)

    def packet(self, qp=0):
        return Packet(Opcode.ACKNOWLEDGE, self.psn, qp=qp, aeth=Aeth(self.syndrome, self.msn))


@dataclass(frozen=True)
class MemWrite:
    """Bytes to write. ``addr`` is absolute: the RETH virtual address + offset for a WRITE (the
    memory-region translation is the caller's), the receive WQE's bus address + offset for a
    SEND (then ``recv`` is that WQE), the READ WQE's local address + offset for READ data.
    ``offset`` is the byte offset inside the message."""
    addr: int
    data: bytes
    offset: int = 0
    recv: "RecvRequest | None" = None


@dataclass(frozen=True)
class ReadResponse:
    """Responder output: answer a READ request at PSN ``psn`` with ``length`` bytes from ``va``
    (``read_response_packets`` expands it); ``msn`` goes into the AETHs."""
    psn: int
    va: int
    rkey: int
    length: int
    msn: int


def read_response_packets(resp, mtu, mem=None, qp=0):
    """The READ response packets of ``resp``: ONLY if it fits one packet, else FIRST, MIDDLE...,
    LAST at consecutive PSNs; every packet carries ``mtu`` bytes but the last; AETH (ACK, msn)
    on FIRST/LAST/ONLY. Payload read from ``mem`` (``read(addr, n)``) when given."""
    n = packets(resp.length, mtu)
    out = []
    for i in range(n):
        off = i * mtu
        size = min(mtu, resp.length - off)
        if n == 1:
            op = Opcode.READ_RESP_ONLY
        elif i == 0:
            op = Opcode.READ_RESP_FIRST
        elif i == n - 1:
            op = Opcode.READ_RESP_LAST
        else:
            op = Opcode.READ_RESP_MIDDLE
        aeth = None if op is Opcode.READ_RESP_MIDDLE else Aeth(ack_syndrome(), resp.msn)
        payload = bytes(mem.read(resp.va + off, size)) if mem is not None and size else b""
        out.append(Packet(op, psn_add(resp.psn, i), qp=qp, payload=payload,
                          src=(resp.va + off, size), aeth=aeth))
    return out


def response_packets(outputs, mtu, mem=None, qp=0):
    """The packets a responder sends for its outputs (``Ack`` and ``ReadResponse``), in order."""
    out = []
    for o in outputs:
        if isinstance(o, Ack):
            out.append(o.packet(qp))
        elif isinstance(o, ReadResponse):
            out.extend(read_response_packets(o, mtu, mem, qp))
    return out


def apply_writes(outputs, mem):
    """Apply every ``MemWrite`` of ``outputs`` to ``mem`` (``write(addr, data)``)."""
    for o in outputs:
        if isinstance(o, MemWrite):
            mem.write(o.addr, o.data)


# --- responder -----------------------------------------------------------------------------------

class InMsg(enum.Enum):
    """Which multi-packet message the responder is in the middle of."""
    NONE = 0
    SEND = 1
    WRITE = 2


# Opcodes legal as the next in-sequence packet, by in_msg.
_LEGAL = {
    InMsg.NONE: frozenset({Opcode.SEND_FIRST, Opcode.SEND_ONLY, Opcode.SEND_ONLY_IMM,
                           Opcode.SEND_ONLY_INV, Opcode.WRITE_FIRST, Opcode.WRITE_ONLY,
                           Opcode.WRITE_ONLY_IMM, Opcode.READ_REQUEST}),
    InMsg.SEND: frozenset({Opcode.SEND_MIDDLE, Opcode.SEND_LAST, Opcode.SEND_LAST_IMM,
                           Opcode.SEND_LAST_INV}),
    InMsg.WRITE: frozenset({Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM}),
}


class ResponderModel:
    """The responder side of one RC QP.

    Parameters: ``pmtu`` path MTU code (1..5), ``ack_coalesce`` (ACK at least every that many
    accepted packets without AckReq; 0 or 1: every packet), ``min_rnr_timer`` (timer code in
    RNR NAKs), ``epsn``/``msn`` initial values, ``qp`` (index put into completions), ``state``
    (``QpState``; only RTR and RTS accept packets; may be changed at any time).

    ``post_recv(rr)`` queues a receive WQE. ``receive(pkt, mr_ok=True)`` returns the outputs of
    one packet, in order: ``MemWrite``, ``Completion`` (``is_recv=True``), ``Ack``,
    ``ReadResponse``. ``mr_ok`` is the memory-region check of a WRITE_FIRST/ONLY or READ_REQUEST
    (a bool, or a callable taking the packet), decided by the caller. ``counts`` tallies what
    happened to packets (names as in ``receive``'s comments).
    """

    def __init__(self, pmtu, ack_coalesce=1, min_rnr_timer=1, epsn=0, msn=0, qp=0,
                 state=QpState.RTS):
        self.mtu = mtu_bytes(pmtu)
        self.ack_coalesce = ack_coalesce
        self.min_rnr_timer = min_rnr_timer
        self.qp = qp
        self.state = QpState(state)
        self._epsn = epsn % PSN_MOD
        self._msn = msn % PSN_MOD
        self._nak_sent = False
        self._in_msg = InMsg.NONE
        self.ack_count = 0
        self.rq = deque()           # posted receive WQEs, oldest first
        self.cur_recv = None        # receive WQE the SEND in progress writes into
        self.msg_off = 0            # bytes of the message in progress received so far
        self.write_va = 0           # WRITE in progress: RETH va and DMA length
        self.write_len = 0
        self.counts = Counter()

    # State the contract names.
    @property
    def epsn(self):
        return self._epsn

    @property
    def msn(self):
        return self._msn

    @property
    def nak_sent(self):
        return self._nak_sent

    @property
    def in_msg(self):
        return self._in_msg

    def post_recv(self, rr):
        self.rq.append(rr)

    def receive(self, pkt, mr_ok=True):
        if self.state not in (QpState.RTR, QpState.RTS):
            self.counts["drop_state"] += 1
            return []
        op = Opcode(pkt.opcode)
        if not op.is_request:
            self.counts["drop_not_request"] += 1
            return []
        d = psn_diff(pkt.psn, self._epsn)
        if d == 0:
            return self._expected(pkt, op, mr_ok)
        if psn_behind(pkt.psn, self._epsn):
            return self._duplicate(pkt, op, mr_ok)
        return self._ahead(pkt)

    # 1. The expected packet.
    def _expected(self, pkt, op, mr_ok):
        p = pkt.psn
        # a. opcode sequence and payload length
        if op not in _LEGAL[self._in_msg] or not self._length_ok(pkt, op):
            self.counts["nak_inv_req"] += 1
            return [self._nak(p, NakCode.INV_REQ)]
        # b. memory region of a WRITE (first packet) or READ
        if op in (Opcode.WRITE_FIRST, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM,
                  Opcode.READ_REQUEST) and not _check(mr_ok, pkt):
            self.counts["nak_rem_access"] += 1
            return [self._nak(p, NakCode.REM_ACCESS)]
        # c. a receive WQE for a SEND or a WRITE with immediate
        out = []
        if op.is_send:
            if op in (Opcode.SEND_FIRST, Opcode.SEND_ONLY, Opcode.SEND_ONLY_IMM,
                      Opcode.SEND_ONLY_INV):
                if not self.rq:
                    self.counts["rnr_nak"] += 1
                    return [self._rnr(p)]
                recv, off = self.rq[0], 0
            else:
                recv, off = self.cur_recv, self.msg_off
            if recv is None:
                # The message already failed its length check: its WQE is gone.
                self.counts["nak_inv_req"] += 1
                return [self._nak(p, NakCode.INV_REQ)]
            if off + pkt.length > recv.length:
                if recv is self.cur_recv:
                    self.cur_recv = None
                else:
                    self.rq.popleft()
                self.counts["nak_inv_req"] += 1
                self.counts["recv_len_err"] += 1
                return [Completion(self.qp, recv.wr_id, WcStatus.LOC_LEN_ERR, WcOpcode.RECV,
                                   is_recv=True),
                        self._nak(p, NakCode.INV_REQ)]
        if op in (Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM) and not self.rq:
            self.counts["rnr_nak"] += 1
            return [self._rnr(p)]

        # d. accept
        self.counts["accepted"] += 1
        ends_message = op.is_last or op.is_only or op is Opcode.READ_REQUEST
        if ends_message:
            self._msn = psn_add(self._msn, 1)
        if op.is_send:
            if op.is_first or op.is_only:
                self.cur_recv, self.msg_off = self.rq.popleft(), 0
            recv = self.cur_recv
            if pkt.length:
                out.append(MemWrite(recv.addr + self.msg_off, _payload(pkt), self.msg_off, recv))
            self.msg_off += pkt.length
            if ends_message:
                out.append(Completion(self.qp, recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV,
                                      byte_len=self.msg_off,
                                      imm=pkt.imm if op.has_imm else None,
                                      invalidated_rkey=pkt.ieth if op.has_ieth else None,
                                      is_recv=True))
                self.cur_recv = None
            self._in_msg = InMsg.NONE if ends_message else InMsg.SEND
            self._epsn = psn_add(p, 1)
        elif op.is_write:
            if op.is_first or op.is_only:
                self.write_va, self.write_len, self.msg_off = pkt.reth.va, pkt.reth.dma_len, 0
            if pkt.length:
                out.append(MemWrite(self.write_va + self.msg_off, _payload(pkt), self.msg_off))
            self.msg_off += pkt.length
            if op.has_imm:
                recv = self.rq.popleft()
                out.append(Completion(self.qp, recv.wr_id, WcStatus.SUCCESS,
                                      WcOpcode.RECV_RDMA_WITH_IMM, byte_len=self.write_len,
                                      imm=pkt.imm, is_recv=True))
            self._in_msg = InMsg.NONE if ends_message else InMsg.WRITE
            self._epsn = psn_add(p, 1)
        else:  # READ_REQUEST: answered by the response, which also acknowledges it
            r = pkt.reth
            out.append(ReadResponse(p, r.va, r.rkey, r.dma_len, self._msn))
            self._in_msg = InMsg.NONE
            self._epsn = psn_add(p, packets(r.dma_len, self.mtu))
            self._nak_sent = False
            return out
        self._nak_sent = False
        if pkt.ackreq:
            out.append(self._ack())
        else:
            self.ack_count += 1
            if self.ack_count >= self.ack_coalesce:
                out.append(self._ack())
        return out

    def _length_ok(self, pkt, op):
        n, mtu = pkt.length, self.mtu
        if op is Opcode.READ_REQUEST:
            return n == 0
        if op.is_first or op.is_middle:
            ok = n == mtu
        elif op.is_last:
            ok = 1 <= n <= mtu
        else:
            ok = n <= mtu
        if ok and op.is_write:
            # The message must add up to the RETH DMA length (see the module docstring).
            left = (pkt.reth.dma_len if op.has_reth else self.write_len - self.msg_off)
            ok = left > mtu if (op.is_first or op.is_middle) else n == left
        return ok

    # 2. A duplicate (PSN behind epsn).
    def _duplicate(self, pkt, op, mr_ok):
        self.counts["duplicate"] += 1
        if op is Opcode.READ_REQUEST:
            if _check(mr_ok, pkt):
                r = pkt.reth
                return [ReadResponse(pkt.psn, r.va, r.rkey, r.dma_len, self._msn)]
            return []
        if pkt.ackreq:
            self.ack_count = 0
            return [Ack(psn_add(self._epsn, -1), ack_syndrome(), self._msn)]
        return []

    # 3. A packet ahead of epsn: something was lost. One NAK, then silence until epsn comes.
    def _ahead(self, pkt):
        self.counts["out_of_sequence"] += 1
        if self._nak_sent:
            return []
        return [self._nak(self._epsn, NakCode.PSN_SEQ_ERR)]

    def _ack(self):
        self.ack_count = 0
        self.counts["ack"] += 1
        return Ack(psn_add(self._epsn, -1), ack_syndrome(), self._msn)

    def _nak(self, psn, code):
        self._nak_sent = True
        self.ack_count = 0
        return Ack(psn, nak_syndrome(code), self._msn)

    def _rnr(self, psn):
        self._nak_sent = True
        self.ack_count = 0
        return Ack(psn, rnr_syndrome(self.min_rnr_timer), self._msn)


def _check(mr_ok, pkt):
    return mr_ok(pkt) if callable(mr_ok) else bool(mr_ok)


def _payload(pkt):
    if len(pkt.payload) != pkt.length:
        raise ValueError(f"{pkt}: payload bytes not filled in ({len(pkt.payload)} of {pkt.length})")
    return bytes(pkt.payload)


# --- requester -----------------------------------------------------------------------------------

@dataclass
class _Wqe:
    wr: WorkRequest
    n: int                          # PSNs the message takes
    first_psn: "int | None" = None  # set when its first packet is sent
    req_psn: "int | None" = None    # READ: PSN of the READ request last sent (responses start here)

    @property
    def is_read(self):
        return self.wr.opcode.is_read

    @property
    def last_psn(self):
        return psn_add(self.first_psn, self.n - 1)

    def contains(self, p):
        return self.first_psn is not None and psn_diff(p, self.first_psn) < self.n


def _request_opcode(wr_op, first, last):
    """BTH opcode of a SEND/WRITE packet at the given position of its message."""
    if wr_op.is_send:
        if first and last:
            return {WrOpcode.SEND: Opcode.SEND_ONLY, WrOpcode.SEND_WITH_IMM: Opcode.SEND_ONLY_IMM,
                    WrOpcode.SEND_WITH_INV: Opcode.SEND_ONLY_INV}[wr_op]
        if last:
            return {WrOpcode.SEND: Opcode.SEND_LAST, WrOpcode.SEND_WITH_IMM: Opcode.SEND_LAST_IMM,
                    WrOpcode.SEND_WITH_INV: Opcode.SEND_LAST_INV}[wr_op]
        return Opcode.SEND_FIRST if first else Opcode.SEND_MIDDLE
    imm = wr_op is WrOpcode.RDMA_WRITE_WITH_IMM
    if first and last:
        return Opcode.WRITE_ONLY_IMM if imm else Opcode.WRITE_ONLY
    if last:
        return Opcode.WRITE_LAST_IMM if imm else Opcode.WRITE_LAST
    return Opcode.WRITE_FIRST if first else Opcode.WRITE_MIDDLE


_NAK_STATUS = {NakCode.INV_REQ: WcStatus.REM_INV_REQ_ERR, NakCode.REM_ACCESS: WcStatus.REM_ACCESS_ERR,
               NakCode.REM_OP: WcStatus.REM_OP_ERR}


class RequesterModel:
    """The requester side of one RC QP.

    Parameters: ``pmtu`` path MTU code (1..5); ``window`` outstanding PSNs allowed before
    sending stops; ``ack_every`` AckReq on PSNs with ``psn % ack_every == ack_every - 1`` (0:
    off); ``retry_cnt`` and ``rnr_retry`` (7 = retry RNR forever); ``timeout`` local ACK timeout
    code (``4.096 us * 2**timeout``, 0 = never); ``sq_psn`` first PSN; ``qp`` index put into
    completions; ``mem`` (optional, ``read(addr, n)``) the payload is read from at send time.

    ``post(wr)`` queues a work request (returns ``[flush completion]`` if the QP is in error).
    ``next_packet()`` returns the next request packet or None (nothing to send, window full,
    waiting for RNR, error). ``receive(pkt)``, ``timeout()`` and ``rnr_expired()`` return lists
    of ``Completion`` and ``MemWrite`` (READ data, at the WQE's local address).
    """

    def __init__(self, pmtu, window=16, ack_every=0, retry_cnt=7, rnr_retry=7, timeout=14,
                 sq_psn=0, qp=0, mem=None):
        self.mtu = mtu_bytes(pmtu)
        self.window = window
        self.ack_every = ack_every
        self.retry_cnt = retry_cnt
        self.rnr_retry = rnr_retry
        self.timeout_code = timeout
        self.qp = qp
        self.mem = mem
        self.sq = []                # WQEs not yet completed, oldest first
        self._una = sq_psn % PSN_MOD
        self._npsn = self._una
        self._high = self._una      # highest npsn ever reached: packets behind it are resent
        self.cur = 0                # index in sq of the WQE being sent
        self.cur_off = 0            # bytes of it already sent
        self._retry_left = retry_cnt
        self._rnr_left = rnr_retry
        self._rnr_wait = False
        self._error = False
        self.timer_kind = None      # None (disarmed), "ack" or "rnr"
        self.timer_us = None        # duration of the running timer
        self.timer_starts = 0       # bumped whenever the timer is started or restarted
        self.counts = Counter()

    # State the contract names.
    @property
    def una(self):
        return self._una

    @property
    def npsn(self):
        return self._npsn

    @property
    def retry_left(self):
        return self._retry_left

    @property
    def rnr_left(self):
        return self._rnr_left

    @property
    def error(self):
        return self._error

    @property
    def rnr_wait(self):
        return self._rnr_wait

    @property
    def timer_armed(self):
        return self.timer_kind is not None

    @property
    def outstanding(self):
        """PSNs sent and not yet acknowledged."""
        return psn_diff(self._npsn, self._una)

    @property
    def idle(self):
        """Every posted WQE has completed."""
        return not self.sq

    def post(self, wr):
        if self._error:
            return [self._completion(wr, WcStatus.WR_FLUSH_ERR)]
        self.sq.append(_Wqe(wr, packets(wr.size, self.mtu)))
        return []

    # --- sending ---

    def next_packet(self):
        if self._error or self._rnr_wait or self.cur >= len(self.sq):
            return None
        if self.outstanding >= self.window:
            return None
        w, wr, psn = self.sq[self.cur], self.sq[self.cur].wr, self._npsn
        if self.cur_off == 0:
            w.first_psn = psn
        if w.is_read:
            left = wr.size - self.cur_off
            n = packets(left, self.mtu)
            w.req_psn = psn
            pkt = Packet(Opcode.READ_REQUEST, psn, reth=Reth(wr.raddr + self.cur_off, wr.rkey, left))
            done = True
        else:
            n = 1
            size = min(self.mtu, wr.size - self.cur_off)
            first, done = self.cur_off == 0, self.cur_off + size >= wr.size
            op = _request_opcode(wr.opcode, first, done)
            pkt = Packet(op, psn)
            if wr.inline is not None:
                pkt.payload = wr.inline[self.cur_off:self.cur_off + size]
            else:
                pkt.src = (wr.laddr + self.cur_off, size)
                if self.mem is not None and size:
                    pkt.payload = bytes(self.mem.read(wr.laddr + self.cur_off, size))
            if wr.opcode.is_write and first:
                pkt.reth = Reth(wr.raddr, wr.rkey, wr.size)
            if op.has_imm:
                pkt.imm = wr.imm
            if op.has_ieth:
                pkt.ieth = wr.invalidate_rkey
            self.cur_off += size
        self._npsn = psn_add(psn, n)
        pkt.ackreq = (done or self.outstanding >= self.window
                      or (self.ack_every > 0 and psn % self.ack_every == self.ack_every - 1))
        if done:
            self.cur += 1
            self.cur_off = 0
        self.counts["sent"] += 1
        if psn_behind(psn, self._high):
            self.counts["resent"] += 1
        else:
            self._high = self._npsn
        if self.timer_kind is None:
            self._start_timer("ack")
        return pkt

    # --- receiving ---

    def receive(self, pkt):
        if self._error:
            return []
        op = Opcode(pkt.opcode)
        if op is Opcode.ACKNOWLEDGE:
            return self._on_acknowledge(pkt.psn, pkt.aeth.syndrome)
        if op.is_read_response:
            return self._on_read_response(pkt, op)
        return []

    def _is_outstanding(self, p):
        return psn_diff(p, self._una) < self.outstanding

    def _on_acknowledge(self, p, syndrome):
        if not self._is_outstanding(p):
            self.counts["ghost"] += 1
            return []
        kind, value = decode_syndrome(syndrome)
        if kind is AckType.ACK:
            self.counts["ack"] += 1
            return self._ack(p)
        if kind is AckType.RESERVED:
            return []
        # Every NAK acknowledges what precedes its PSN.
        out = self._ack(psn_add(p, -1)) if p != self._una else []
        if kind is AckType.RNR:
            self.counts["rnr_nak"] += 1
            if p != self._una:
                return out
            if self._rnr_left == 0 and self.rnr_retry != 7:
                return out + self._fatal(0, WcStatus.RNR_RETRY_EXC_ERR)
            if self.rnr_retry != 7:
                self._rnr_left -= 1
            self._rnr_wait = True
            self._start_timer("rnr", RNR_TIMER_US[value])
            return out
        if value == NakCode.PSN_SEQ_ERR:
            self.counts["nak_seq"] += 1
            if p != self._una:
                return out
            return out + self._retry()
        self.counts["nak_fatal"] += 1
        status = _NAK_STATUS.get(value, WcStatus.REM_OP_ERR)
        idx = next(i for i, w in enumerate(self.sq) if w.contains(p))
        return out + self._fatal(idx, status)

    def _ack(self, p):
        """Everything up to and including PSN ``p`` (outstanding) arrived at the responder."""
        out, old_una = [], self._una
        while self.sq:
            w = self.sq[0]
            if w.is_read:
                # An ACK at or past an unfinished READ: its responses were lost. Ask again.
                if not psn_behind(p, w.first_psn):
                    self.counts["read_rewind"] += 1
                    self._rewind()
                break
            if not psn_ahead(w.last_psn, p):
                self._una = psn_add(w.last_psn, 1)
                out += self._retire(WcStatus.SUCCESS)
                continue
            self._una = psn_add(p, 1)
            break
        if self._una != old_una:
            self._progress()
        return out

    def _on_read_response(self, pkt, op):
        p = pkt.psn
        if not self._is_outstanding(p):
            self.counts["ghost"] += 1
            return []
        out, old_una = [], self._una
        # A response acknowledges every earlier SEND/WRITE.
        while self.sq and not self.sq[0].is_read and psn_behind(self.sq[0].last_psn, p):
            self._una = psn_add(self.sq[0].last_psn, 1)
            out += self._retire(WcStatus.SUCCESS)
        w = self.sq[0] if self.sq else None
        if p == self._una and w is not None and w.is_read and w.contains(p) \
                and self._response_fits(w, p, op, pkt.length):
            idx = psn_diff(p, w.first_psn)
            if pkt.length:
                out.append(MemWrite(w.wr.laddr + idx * self.mtu, _payload(pkt), idx * self.mtu))
            self._una = psn_add(p, 1)
            self.counts["read_resp"] += 1
            if p == w.last_psn:
                out += self._retire(WcStatus.SUCCESS)
        else:
            self.counts["read_resp_dropped"] += 1
        if self._una != old_una:
            self._progress()
        return out

    def _response_fits(self, w, p, op, length):
        """Opcode and length of a READ response at PSN ``p`` match its place in the response to
        the READ request last sent for ``w``."""
        k = psn_diff(p, w.req_psn)
        n_req = w.n - psn_diff(w.req_psn, w.first_psn)
        if k >= n_req:
            return False
        if n_req == 1:
            want = Opcode.READ_RESP_ONLY
        elif k == 0:
            want = Opcode.READ_RESP_FIRST
        elif k == n_req - 1:
            want = Opcode.READ_RESP_LAST
        else:
            want = Opcode.READ_RESP_MIDDLE
        off = psn_diff(p, w.first_psn) * self.mtu
        return op is want and length == min(self.mtu, w.wr.size - off)

    # --- timers ---

    def timeout(self):
        """The local ACK timer expired."""
        if self._error or self._rnr_wait or self.timer_kind != "ack" or not self.outstanding:
            return []
        self.timer_kind = self.timer_us = None
        self.counts["timeout"] += 1
        return self._retry()

    def rnr_expired(self):
        """The RNR NAK delay is over: send again from una."""
        if not self._rnr_wait:
            return []
        self._rnr_wait = False
        self.timer_kind = self.timer_us = None
        self._rewind()
        return []

    def _start_timer(self, kind, us=None):
        if kind == "ack":
            us = ack_timeout_us(self.timeout_code)
            if us is None:
                return
        self.timer_kind, self.timer_us = kind, us
        self.timer_starts += 1

    def _progress(self):
        """una advanced: fresh retry budgets, the ACK timer restarts (stops if all is acked)."""
        self._retry_left = self.retry_cnt
        self._rnr_left = self.rnr_retry
        if self._rnr_wait:
            return
        if self.outstanding:
            self._start_timer("ack")
        else:
            self.timer_kind = self.timer_us = None

    # --- recovery and errors ---

    def _retry(self):
        if self._retry_left == 0:
            return self._fatal(0, WcStatus.RETRY_EXC_ERR)
        self._retry_left -= 1
        self._rewind()
        return []

    def _rewind(self):
        """Go-back-N: send again from una, inside the oldest incomplete WQE."""
        self.counts["rewind"] += 1
        self._npsn = self._una
        self.cur = 0
        w = self.sq[0] if self.sq else None
        self.cur_off = 0 if w is None or w.first_psn is None else \
            psn_diff(self._una, w.first_psn) * self.mtu
        if self.timer_kind == "ack":
            self.timer_kind = self.timer_us = None

    def _retire(self, status):
        w = self.sq.pop(0)
        self.cur -= 1
        if w.wr.signaled or status != WcStatus.SUCCESS:
            return [self._completion(w.wr, status)]
        return []

    def _completion(self, wr, status):
        return Completion(self.qp, wr.wr_id, status, wc_opcode(wr.opcode),
                          byte_len=wr.size if status == WcStatus.SUCCESS else 0)

    def _fatal(self, idx, status):
        """WQE ``idx`` failed: it completes with ``status``, every other one is flushed."""
        self.counts["fatal"] += 1
        out = [self._completion(w.wr, status if i == idx else WcStatus.WR_FLUSH_ERR)
               for i, w in enumerate(self.sq)]
        self.sq.clear()
        self._error = True
        self.cur = self.cur_off = 0
        self.timer_kind = self.timer_us = None
        return out


# --- two model NICs over a lossy channel ---------------------------------------------------------

class LossyChannel:
    """Seeded impairments of one direction of the wire: each packet is dropped with probability
    ``loss``, duplicated with probability ``dup`` (default ``loss``) and delayed by up to
    ``3 * latency`` extra (so overtaken) with probability ``reorder`` (default ``loss``)."""

    def __init__(self, rng, loss=0.0, latency_us=1.0, dup=None, reorder=None):
        self.rng = rng
        self.loss = loss
        self.latency = latency_us
        self.dup = loss if dup is None else dup
        self.reorder = loss if reorder is None else reorder
        self.counts = Counter()

    def delays(self):
        """Arrival delays of one packet's copies (empty: dropped)."""
        self.counts["sent"] += 1
        if self.rng.random() < self.loss:
            self.counts["dropped"] += 1
            return []
        copies = 2 if self.rng.random() < self.dup else 1
        self.counts["duplicated"] += copies - 1
        out = []
        for _ in range(copies):
            d = self.latency
            if self.rng.random() < self.reorder:
                d += self.rng.uniform(0, 3 * self.latency)
                self.counts["delayed"] += 1
            out.append(d)
        return out


class PairSim:
    """Two model NICs, ``"a"`` and ``"b"``, each QP a ``RequesterModel`` + ``ResponderModel``
    pair, talking over a ``LossyChannel`` per direction in simulated time (microseconds).

    ``mems`` maps side to its host memory (``read(addr, n)``, ``write(addr, data)``); memory
    regions are identity-mapped (RETH va = bus address) and ``mr_ok`` (bool or callable on the
    packet) is every MR check. Every QP uses the keyword parameters given here.

    ``connect(qp_a, qp_b, psn_ab, psn_ba)`` pairs two QPs (``psn_ab``: first PSN of a's
    requester = b's responder epsn). ``post_send(side, wr)``, ``post_recv(side, rr, at_us=None)``
    (later than now when ``at_us`` is given), ``run(until_us)`` until every send queue is empty
    and the wire is quiet, or until the time limit. ``completions`` holds ``(side, Completion)``
    in the order they happened; ``now`` is the simulated time.
    """

    def __init__(self, mems, *, rng=None, loss=0.0, latency_us=1.0, pmtu=1, window=16,
                 ack_every=0, ack_coalesce=1, retry_cnt=7, rnr_retry=7, timeout=3,
                 min_rnr_timer=1, mr_ok=True):
        self.mems = mems
        self.rng = rng or random.Random(0)
        self.wire = {s: LossyChannel(self.rng, loss, latency_us) for s in ("a", "b")}  # by sender
        self.mtu = mtu_bytes(pmtu)
        self.params = dict(pmtu=pmtu, window=window, ack_every=ack_every, retry_cnt=retry_cnt,
                           rnr_retry=rnr_retry, timeout=timeout)
        self.rparams = dict(pmtu=pmtu, ack_coalesce=ack_coalesce, min_rnr_timer=min_rnr_timer)
        self.mr_ok = mr_ok
        self.req = {}               # (side, qp) -> RequesterModel
        self.resp = {}              # (side, qp) -> ResponderModel
        self.peer = {}              # (side, qp) -> (side, qp)
        self.completions = []
        self.now = 0.0
        self._events = []           # heap of (time, seq, kind, args)
        self._seq = 0
        self._timer_seen = {}       # (side, qp) -> timer_starts already scheduled

    def connect(self, qp_a, qp_b, psn_ab=0, psn_ba=0):
        for side, qp, peer, sq_psn, epsn in (("a", qp_a, ("b", qp_b), psn_ab, psn_ba),
                                             ("b", qp_b, ("a", qp_a), psn_ba, psn_ab)):
            self.req[side, qp] = RequesterModel(sq_psn=sq_psn, qp=qp, mem=self.mems[side],
                                                **self.params)
            self.resp[side, qp] = ResponderModel(epsn=epsn, qp=qp, **self.rparams)
            self.peer[side, qp] = peer
            self._timer_seen[side, qp] = 0

    def post_send(self, side, wr):
        self._complete(side, self.req[side, wr.qp].post(wr))

    def post_recv(self, side, rr, at_us=None):
        if at_us is None or at_us <= self.now:
            self.resp[side, rr.qp].post_recv(rr)
        else:
            self._schedule(at_us, "recv", (side, rr))

    def run(self, until_us=1e9):
        self._pump()
        while self._events:
            ev = heapq.heappop(self._events)
            t, _, kind, args = ev
            if t > until_us:
                heapq.heappush(self._events, ev)
                break
            self.now = t
            if kind == "pkt":
                self._deliver(*args)
            elif kind == "recv":
                side, rr = args
                self.resp[side, rr.qp].post_recv(rr)
            elif kind == "timer":
                side, qp, starts = args
                r = self.req[side, qp]
                if r.timer_starts == starts and r.timer_armed:
                    out = r.timeout() if r.timer_kind == "ack" else r.rnr_expired()
                    self._requester_out(side, qp, out)
            self._pump()
            if self.idle and not any(k == "pkt" for _, _, k, _ in self._events):
                break
        return self.completions

    @property
    def idle(self):
        return all(r.idle or r.error for r in self.req.values())

    # internals

    def _schedule(self, t, kind, args):
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, args))

    def _send(self, side, dest, pkt):
        for d in self.wire[side].delays():
            self._schedule(self.now + d, "pkt", (dest, pkt))

    def _pump(self):
        """Every requester sends what its window allows; timers get (re)scheduled."""
        for (side, qp), r in self.req.items():
            peer = self.peer[side, qp]
            while (pkt := r.next_packet()) is not None:
                pkt.qp = peer[1]
                self._send(side, peer, pkt)
            self._watch_timer(side, qp)

    def _watch_timer(self, side, qp):
        r = self.req[side, qp]
        if r.timer_armed and r.timer_starts != self._timer_seen[side, qp]:
            self._timer_seen[side, qp] = r.timer_starts
            self._schedule(self.now + r.timer_us, "timer", (side, qp, r.timer_starts))

    def _deliver(self, dest, pkt):
        side, qp = dest
        back = self.peer[dest]
        if Opcode(pkt.opcode).is_request:
            out = self.resp[dest].receive(pkt, self.mr_ok)
            apply_writes(out, self.mems[side])
            self._complete(side, [o for o in out if isinstance(o, Completion)])
            for rp in response_packets(out, self.mtu, self.mems[side], qp=back[1]):
                self._send(side, back, rp)
        else:
            self._requester_out(side, qp, self.req[dest].receive(pkt))

    def _requester_out(self, side, qp, out):
        apply_writes(out, self.mems[side])
        self._complete(side, [o for o in out if isinstance(o, Completion)])
        self._watch_timer(side, qp)

    def _complete(self, side, cqes):
        self.completions.extend((side, c) for c in cqes)
