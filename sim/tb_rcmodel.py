# Ref: IBTA Vol 1 Rel 1.4 ch. 9.7 (RC responder and requester), 9.9 (errors); Annex A17 (RoCEv2);
#      Stellar's transport contract "rcspec" (the PSN semantics shared by the RTL and the model).
"""cocotb tests of one NIC core (``stellar_nic``) against the RC reference model
(:mod:`stellar.sim.rcmodel`), packet by packet, on seeded random sequences.

``responder``  One QP in RTS answers a random stream of request packets crafted here
               (:class:`RequestDriver`: SEND / WRITE First/Middle/Last/Only with and without
               immediate or invalidate, READ requests; in order, duplicates, losses and
               go-back-N resends, strays far ahead/behind, PSNs and MSNs near the 24-bit wrap,
               illegal opcode sequences, wrong lengths, WRITEs not adding up to their RETH,
               bad rkeys / PDs / tenants / access / bounds, SENDs without a posted receive,
               receive buffers too small, QP state changes). The same packets go, in the same
               order, into a ``ResponderModel`` configured like the QP (:class:`ResponderRun`).
               Every frame the core sends (ACK, NAK, RNR NAK, READ responses: opcode, PSN,
               AckReq, AETH, RETH/ImmDt/IETH, payload; ICRC and destination QP checked) is
               compared with the model's outputs in order, every receive completion with the
               model's, and at the end host memory (content and per-byte write counts), the QP
               context (state, epsn, msn) and the transport counters with the model's.
``requester``  The same core posts random WRITE / SEND / READ work requests (with immediate,
               invalidate, inline, unsignaled) on a series of QPs (:class:`RequesterRun`); the
               testbench is the remote responder (a second ``ResponderModel`` with its own
               memory and receive queue) and the wire: requests lost, responses lost (READ
               responses among them), duplicated and reordered, ACKs coalesced and carrying
               credit counts, RNR NAKs (no receive posted), remote access / operational errors,
               reserved NAK codes, ghost ACKs. Every request frame the core sends is compared
               with ``RequesterModel.next_packet()``; every response goes to both; timer expiries
               are taken from the core's packet stream (a packet, or a completion, the model did
               not predict while nothing is in flight is the ACK timeout or the end of the RNR
               delay: the model's ``timeout()`` / ``rnr_expired()`` is called there and must then
               predict it). Completions (wr_id, status, opcode, order; byte_len of READs), READ
               data in host memory (content, each byte once) and the QP state are compared.
``scenario``   Directed reproducers of the divergences in ``KNOWN`` (``STELLAR_TB_SCENARIO``),
               and regression tests of those fixed since (``FIXED``).

Determinism. The core's answers must not depend on timing, so the testbench keeps the two
worlds in step: a packet that makes the responder write memory is not fed while a READ response
(which reads memory when it is built) is still owed; receive WQEs are posted and QP states
changed only when the core is idle; on the requester side a response is fed only once the core
has sent every packet the model says the previous event allows, a work request is posted only
once the transport has taken every response fed (its counters say so), and nothing goes in when
the core's ACK or RNR timer could expire on the way (:class:`RtlTimer` keeps a lower bound of the
deadline; when it is close the testbench waits for the expiry first).

Divergences. Where the core departs from the contract or the model (``KNOWN``) the
random tests steer clear of the case -- the script loses the response that would show it, or a
run ends where the core fails the QP -- unless ``STELLAR_TB_KNOWN_<NAME>=1``; each has a
``scenario``. ``model_receive`` works around a model defect (M1).

Parameters (``STELLAR_TB_*``): ``width``, ``steps`` (events per test), ``pmtu``, ``pause``
(backpressure probability on every stream), ``seed`` (the launcher's; ``STELLAR_SEED=<n>``
replays a run), ``verbose`` (log every event), ``scenario``, ``known_<name>``.
"""

import collections
import copy
import logging
import random
from types import SimpleNamespace

import cocotb
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource
from stellar.hdl.flow.fields import Access, PathMtu, QpState

from .nic import MR_INDEX, MR_TAG, QpConfig, SimNic
from .rcmodel import (
    Ack,
    Aeth,
    InMsg,
    MemWrite,
    Packet,
    ReadResponse,
    RequesterModel,
    ResponderModel,
    Reth,
    read_response_packets,
    response_packets,
)
from .rcpackets import fields, from_frame, show, to_frame
from .tb import TB, pause_generator, tb_param
from .verbs import (
    PSN_MOD,
    RNR_TIMER_US,
    Completion,
    NakCode,
    Opcode,
    RecvRequest,
    WcOpcode,
    WcStatus,
    WorkRequest,
    WrOpcode,
    decode_syndrome,
    mtu_bytes,
    nak_syndrome,
    packets,
    psn_add,
    psn_ahead,
    psn_behind,
    psn_diff,
    wc_opcode,
)

MEM_SIZE = 1 << 20
QP_INDEX = 3
QPN = 0x0ABC
REMOTE_QPN = 0x0DEF
PEER = SimpleNamespace(mac=0x02_00_00_00_00_C0, ip=0x0A_00_00_63)


# Divergences found between the core and the contract/model. The random generators steer clear
# of each (so a run passes) unless its switch STELLAR_TB_KNOWN_<NAME>=1 asks for it (the
# reproducers in tests/cocotb/test_rcmodel_rtl.py).
KNOWN = {
    # D2 (RTL vs contract and model; the RTL's documented fix): an ACK/NAK past a READ whose
    # responses were lost rewinds the core only once until progress; the contract (and the
    # model) rewind on every such ACK. The script loses such a second ACK/NAK.
    "lost_read_once": "a second ACK past the same unanswered READ before any progress",
    # D3 (RTL vs contract, model and the engine's own docstring): the core's rewind for a lost
    # READ costs one retry_cnt (and is fatal RETRY_EXC_ERR when none is left); the contract's
    # READ rewind costs nothing. A run that reaches a point where the two retry counts decide
    # differently ends there (the core's fatal error is checked, the model's view is dropped).
    "lost_read_retry": "retry budget exhausted after a lost-READ rewind",
    # D4 (RTL vs contract and model): a fatal NAK (invalid request, remote access, remote
    # operational) whose implicit ACK passes a READ with lost responses is taken by the core
    # as a lost-READ ACK: it rewinds and the NAK's error is forgotten (it comes back with the
    # retransmission). The contract fails the QP at once (the model flushes the READ first).
    # The script loses such a NAK.
    "fatal_nak_past_read": "a fatal NAK past a READ whose responses were lost",
    # D6 (RTL vs model; the RTL's documented fix, contract unclear): READ response positions.
    # The core takes FIRST/ONLY at any PSN of a READ and LAST/ONLY exactly for its last bytes
    # (MIDDLE/FIRST elsewhere); the model counts positions from the READ request it sent last.
    # They differ on stale responses that arrive after a re-request (reordering): the script
    # loses a response the two would take differently.
    "read_position": "a READ response the core and the model place differently",
    # D7 (RTL vs contract and model; the RTL's documented fix): responses are valid up to the
    # highest PSN ever sent (hpsn), the contract's up to npsn; after a rewind the two differ.
    # The script loses a response the two would judge differently.
    "hpsn_window": "a response between npsn and the highest PSN sent",
    # D8 (RTL vs contract and model): ack_coalesce 0. The contract ACKs every accepted packet
    # then ("++ack_count >= 0"), so does the model; the core's CSR reads 0 as "only on AckReq".
    # The random responder never uses 0.
    "ack_coalesce_zero": "ack_coalesce 0",
    # D10 (RTL vs contract): a WRITE or READ whose [va, va + len) crosses a page of a
    # page-list memory region is NAKed (remote access error): the transport counts the MR
    # check's ``span`` (bytes contiguous from the first, up to the page end) short of the RETH
    # length as a failure, though the region holds the whole range. The random tests use
    # contiguous regions only.
    "page_list_span": "RETH ranges crossing a page of a page-list region",
}


# Found by these tests and fixed in the core since (their scenarios are regression tests now):
# D1 a duplicate's re-ACK did not restart the ACK coalescing count (af93d95); D5 an AETH with
# a reserved syndrome implicitly acknowledged PSN - 1 (af93d95: now ignored, as the model
# does); D9 progress during an RNR wait re-armed the timer as an ACK timer, or disarmed it, and
# the QP waited forever (b0a4cdf, 31badc7).
FIXED = ("dup_ack_count", "reserved_syndrome", "rnr_progress")


def known_cases():
    return {k: tb_param(f"known_{k}", bool, False) for k in KNOWN}


# --------------------------------------------------------------------------------------------
# Memory regions: the table the core is given, and an independent Python check of it
# --------------------------------------------------------------------------------------------

class MrRef:
    """The memory regions the testbench registers, and the check IBTA 9.7.4 / ``MrReason`` asks
    for: zero length always passes; else the key's entry must exist with the key's tag, belong
    to the QP's tenant and PD, grant the access, and hold ``[va, va + len)``."""

    def __init__(self, entries):
        self.entries = entries          # index -> dict(tag, tenant, pd, access, va, length, bus)

    def lookup(self, key, va, length, access, tenant=0, pd=0):
        """``(ok, bus address or None)``."""
        if length == 0:
            return True, None
        e = self.entries.get(key >> 8)
        if e is None or e["tag"] != key & 0xFF or e["tenant"] != tenant or e["pd"] != pd:
            return False, None
        if access & ~e["access"]:
            return False, None
        if not (e["va"] <= va and va + length <= e["va"] + e["length"]):
            return False, None
        return True, self._bus(e, va)

    @staticmethod
    def _bus(e, va):
        if "pages" not in e:
            return e["bus"] + (va - e["va"])
        shift = e["page_shift"]
        off = va - e["va"] + (e["va"] & ((1 << shift) - 1))
        return e["pages"][off >> shift] + (va & ((1 << shift) - 1))

    def spans(self, va, n):
        """``[(bus address, bytes)]`` covering ``[va, va + n)`` of the region holding ``va``
        (one piece per page of a page-list region)."""
        e = self._region(va)
        out = []
        while n > 0:
            k = n if "pages" not in e else min(n, (1 << e["page_shift"])
                                               - (va & ((1 << e["page_shift"]) - 1)))
            out.append((self._bus(e, va), k))
            va, n = va + k, n - k
        return out

    def check_packet(self, pkt):
        """``mr_ok`` of ``ResponderModel.receive``: the RETH of a WRITE First/Only or READ."""
        access = Access.REMOTE_READ if pkt.opcode == Opcode.READ_REQUEST else Access.REMOTE_WRITE
        return self.lookup(pkt.reth.rkey, pkt.reth.va, pkt.reth.dma_len, access)[0]

    def _region(self, va):
        """The one usable region holding ``va`` (the regions' VA ranges are disjoint)."""
        for e in self.entries.values():
            if e["va"] <= va < e["va"] + e["length"] and e["tenant"] == 0 and e["pd"] == 0:
                return e
        raise KeyError(f"va {va:#x} is in no region")


async def register_regions(nic):
    """MR 1 (SimNic.setup: all memory, va = bus) and the regions the random requests aim at."""
    full = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
    spec = {
        MR_INDEX: dict(tag=MR_TAG, tenant=0, pd=0, access=int(full), va=0, length=MEM_SIZE, bus=0),
        # read-only, translated (va far from its bus address)
        2: dict(tag=0x33, tenant=0, pd=0, access=int(Access.REMOTE_READ), va=0x8000_0000,
                length=0x10000, bus=0x80000),
        # write-only, translated
        5: dict(tag=0x55, tenant=0, pd=0, access=int(Access.REMOTE_WRITE), va=0x1_0000_0000,
                length=0x10000, bus=0xC0000),
        # another protection domain, another tenant: never usable from the test QP
        3: dict(tag=0x44, tenant=0, pd=1, access=int(full), va=0, length=MEM_SIZE, bus=0),
        4: dict(tag=0x66, tenant=1, pd=0, access=int(full), va=0, length=MEM_SIZE, bus=0),
    }
    for index, e in spec.items():
        if index == MR_INDEX:
            continue        # SimNic.setup registered it
        await nic.tables.write_mr(index, tag=e["tag"], tenant=e["tenant"], pd=e["pd"],
                                  access=e["access"], va=e["va"], length=e["length"],
                                  bus_base=e["bus"])
    return MrRef(spec)


class Mirror:
    """What host memory must hold: a copy of the initial contents plus the model's writes, and
    how many times each byte was written."""

    def __init__(self, data):
        self.data = bytearray(data)
        self.counts = collections.Counter()

    def read(self, addr, n):
        return bytes(self.data[addr:addr + n])

    def write(self, addr, data):
        assert 0 <= addr and addr + len(data) <= len(self.data), f"write outside memory {addr:#x}"
        self.data[addr:addr + len(data)] = data
        for a in range(addr, addr + len(data)):
            self.counts[a] += 1


def cqe_key(c, *, requester=False):
    """The fields of a completion that are compared. Receive completions: everything. Send
    completions: wr_id, status, opcode, and byte_len of a successful READ (the contract and
    verbs define nothing else; the RTL reports 0 for SEND/WRITE, the model the message length)."""
    if not requester:
        return (c.qp, c.wr_id, WcStatus(c.status), WcOpcode(c.opcode), c.byte_len, c.imm,
                c.invalidated_rkey, bool(c.is_recv))
    bl = c.byte_len if (c.status == WcStatus.SUCCESS and c.opcode == WcOpcode.RDMA_READ) else None
    return (c.qp, c.wr_id, WcStatus(c.status), WcOpcode(c.opcode), bl, bool(c.is_recv))


# --------------------------------------------------------------------------------------------
# The bench: one stellar_nic, its wire ports, capture of what it sends
# --------------------------------------------------------------------------------------------

class Mismatch(AssertionError):
    pass


class Bench(TB):
    def __init__(self, dut, *, pause):
        super().__init__(dut)
        # the launcher passes the seed (STELLAR_SEED=<n> replays a run); cocotb's own per-test
        # seed otherwise
        self.seed = tb_param("seed", int, cocotb.RANDOM_SEED)
        self.rng = random.Random(self.seed)
        self.log.info("rcmodel bench seed %d (STELLAR_SEED=%d replays it)", self.seed, self.seed)
        # ``prefix`` "a": the bench drives core A of ``stellar_nic2`` (the same NicCore as
        # ``stellar_nic``, its ports prefixed ``a_``; core B's inputs stay idle), so a run can reuse
        # the pair build of the two-NIC tests instead of building one core on its own.
        prefix = tb_param("prefix", str, "")
        p = f"{prefix}_" if prefix else ""
        self.width = len(getattr(dut, f"{p}s_axis_rx_tdata"))
        self.nic = SimNic(dut, prefix=prefix, mem_size=MEM_SIZE, pause=pause, seed=self.seed)
        self.rx = AxiStreamSource(AxiStreamBus.from_prefix(dut, f"{p}s_axis_rx"), dut.clk, dut.rst)
        self.tx = AxiStreamSink(AxiStreamBus.from_prefix(dut, f"{p}m_axis_tx"), dut.clk, dut.rst)
        n = self.nic
        for log in (self.rx.log, self.tx.log, n.mem.write_if.log, n.mem.read_if.log,
                    n.wr_source.log, n.rr_source.log, n.cq_sink.log):
            log.setLevel(logging.WARNING)
        if pause:
            self.rx.set_pause_generator(pause_generator(pause, name="rx"))
            self.tx.set_pause_generator(pause_generator(pause, name="tx"))
        self.remote_qpn = REMOTE_QPN
        self.responses_fed = 0         # response packets into s_axis_rx (requester tests)
        self.tx_handler = None
        self.cq_handler = None
        self.tx_frames = 0
        self.cq_count = 0
        self.failure = None
        self.history = collections.deque(maxlen=40)     # recent events, for failure reports
        self.verbose = tb_param("verbose", bool, False)  # log every event as it happens

    async def start(self):
        await self.reset()
        await self.nic.setup()
        self.mr = await register_regions(self.nic)
        self.nic.mem.fill_random(0, MEM_SIZE, self.rng)
        self.mirror = Mirror(self.nic.mem.read(0, MEM_SIZE))
        self.nic.mem.clear_record()
        cocotb.start_soon(self._capture_tx())
        cocotb.start_soon(self._capture_cq())

    def note(self, text):
        self.history.append(f"[{cocotb.utils.get_sim_time('ns'):.0f} ns] {text}")
        if self.verbose:
            self.log.info("%s", text)

    def fail(self, text):
        if self.failure is None:
            hist = "\n    ".join(self.history)
            self.failure = (f"{text}\n  seed {self.seed}; recent events:\n    {hist}")
            self.log.error("%s", self.failure)

    def check(self):
        if self.failure is not None:
            raise Mismatch(self.failure)

    async def _capture_tx(self):
        while True:
            frame = await self.tx.recv()
            self.tx_frames += 1
            try:
                parsed = from_frame(frame.tdata)
            except ValueError as e:
                self.fail(f"core sent a frame that is not an RC packet: {e}")
                continue
            if not parsed.icrc_ok:
                self.fail(f"core sent a frame with a wrong ICRC: {show(parsed.pkt)}")
            if parsed.dest_qp != self.remote_qpn:
                self.fail(f"core sent to QP {parsed.dest_qp:#x}, not {self.remote_qpn:#x}")
            self.tx_handler(parsed.pkt)

    async def _capture_cq(self):
        while True:
            c = await self.nic.poll()
            self.cq_count += 1
            self.cq_handler(c)

    async def wait_until(self, cond, limit, what):
        """Poll ``cond()`` every 4 clocks for at most ``limit`` clocks."""
        waited = 0
        while not cond():
            if self.failure is not None:
                self.check()
            if waited >= limit:
                self.fail(f"timeout after {limit} clocks waiting for {what}")
                self.check()
            await ClockCycles(self.dut.clk, 4)
            waited += 4
        return waited

    async def responses_processed(self):
        """Wait until the transport has taken every response fed so far: each one counts once
        in ``rx_acks`` or ``rx_stale``. (Work requests reach the transport directly, so a post
        must not overtake a response still in the receive pipeline.)"""
        for _ in range(200):
            n = (await self.nic.read_reg("transport.rx_acks")
                 + await self.nic.read_reg("transport.rx_stale"))
            if n == self.responses_fed:
                return
            assert n < self.responses_fed, f"transport took {n} responses of {self.responses_fed}"
            await ClockCycles(self.dut.clk, 16)
        self.fail(f"the transport took {n} of the {self.responses_fed} responses fed")
        self.check()

    async def send_frame(self, frame):
        await self.rx.send(AxiStreamFrame(frame))

    async def rx_idle(self):
        await self.wait_until(lambda: self.rx.idle(), 200_000, "the RX source to drain")


async def configure_qp(nic, cfg, *, sq_psn, epsn):
    await nic.create_qp(QP_INDEX, QPN, peer=PEER, remote_qpn=REMOTE_QPN, cfg=cfg, sq_psn=sq_psn,
                        rq_psn=epsn)


def mtu_of(pmtu):
    return mtu_bytes(int(pmtu))


# --------------------------------------------------------------------------------------------
# 1. Responder: random request streams
# --------------------------------------------------------------------------------------------

SEND_OPS = {  # (first, middle, last choices, only choices)
    "send": ([Opcode.SEND_LAST, Opcode.SEND_LAST_IMM, Opcode.SEND_LAST_INV],
             [Opcode.SEND_ONLY, Opcode.SEND_ONLY_IMM, Opcode.SEND_ONLY_INV]),
    "write": ([Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM],
              [Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM]),
}
_STARTS = [Opcode.SEND_FIRST, Opcode.SEND_ONLY, Opcode.WRITE_FIRST, Opcode.WRITE_ONLY,
           Opcode.READ_REQUEST]
_SEND_MORE = [Opcode.SEND_MIDDLE, Opcode.SEND_LAST, Opcode.SEND_LAST_IMM]
_WRITE_MORE = [Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM]
ILLEGAL = {InMsg.NONE: _SEND_MORE + _WRITE_MORE, InMsg.SEND: _STARTS + _WRITE_MORE,
           InMsg.WRITE: _STARTS + _SEND_MORE}
# IETH keys of SEND with invalidate name no region the test uses (index 40 is never registered):
# the model does not track invalidation.
INV_KEY_INDEX = 40


class RequestDriver:
    """Generates the request packets a (sloppy) requester sends to the responder under test.

    It keeps a plan: the correct packet for every PSN from the responder's first expected PSN
    on (messages are added as the plan runs out), and a cursor. Each step it sends the packet
    at the cursor (sometimes in a faulty variant: wrong opcode, wrong length, bad key), skips
    one (a loss: what follows is out of sequence), repeats an old one (a duplicate), or sends
    one at a far-away PSN. It listens to the responder's answers as a requester would: a NAK
    or RNR NAK at PSN e rewinds the cursor to e a few packets later (packets in flight); a
    remote access NAK replaces the message from e with a new one.
    """

    def __init__(self, rng, mtu, epsn, mr, model, known):
        self.rng = rng
        # The responder model, read only: its message state (faults are made illegal there),
        # its expected PSN (what a requester's timeout goes back to), its ACK count.
        self.model = model
        self.known = known          # KNOWN divergence cases to generate (see KNOWN)
        self.quiet = 0              # packets sent since the responder last answered
        self.mtu = mtu
        self.mr = mr
        self.plan = {}              # psn -> Packet
        self.span = {}              # psn -> PSNs its packet takes (a READ request: all of them)
        self.plan_end = epsn        # first PSN not planned
        self.cursor = epsn
        self.rewind_at = None       # (psn, after n more sends)
        self.sent = collections.deque(maxlen=64)    # recently sent PSNs of the plan
        self.write_area = (0x10000, 0x80000)
        self.msg_count = 0

    # --- messages ---

    def _payload(self, n):
        return self.rng.randbytes(n)

    def _length(self, max_pkts=3, zero=True):
        r = self.rng.random()
        mtu = self.mtu
        if r < 0.1 and zero:
            return 0
        if r < 0.45:
            return self.rng.randint(1, mtu)
        if r < 0.55:
            return mtu * self.rng.randint(1, max_pkts)
        return self.rng.randint(1, mtu * max_pkts)

    def _rkey_va(self, kind, length):
        """RETH key and address: mostly valid, sometimes a failing check of each kind."""
        rng = self.rng
        r = rng.random()
        mr = self.mr.entries
        if r < 0.06:                                            # stale tag
            return (MR_INDEX << 8) | ((MR_TAG + rng.randint(1, 255)) & 0xFF), 0x20000
        if r < 0.08:                                            # no such entry
            return (rng.choice([9, 63, 200, 0xFFFFFF]) << 8) | 0x12, 0x20000
        if r < 0.10:                                            # other PD / tenant
            i = rng.choice([3, 4])
            return (i << 8) | mr[i]["tag"], 0x20000
        if r < 0.12:                                            # access not granted
            i = 2 if kind == "write" else 5
            return (i << 8) | mr[i]["tag"], mr[i]["va"] + 0x100
        if r < 0.14:                                            # out of bounds
            return (MR_INDEX << 8) | MR_TAG, MEM_SIZE - rng.randint(0, max(length - 1, 0))
        if kind == "write":
            if rng.random() < 0.25:
                e = mr[5]
                return (5 << 8) | e["tag"], e["va"] + rng.randrange(0, e["length"] - length + 1)
            lo, hi = self.write_area
            return (MR_INDEX << 8) | MR_TAG, rng.randrange(lo, hi - length)
        if rng.random() < 0.3:
            e = mr[2]
            return (2 << 8) | e["tag"], e["va"] + rng.randrange(0, e["length"] - length + 1)
        return (MR_INDEX << 8) | MR_TAG, rng.randrange(0, MEM_SIZE - length + 1)

    def new_message(self, psn):
        """Plan a new message starting at ``psn``."""
        rng = self.rng
        mtu = self.mtu
        self.msg_count += 1
        kind = rng.choices(["send", "write", "read"], [4, 4, 2])[0]
        if kind == "read":
            length = self._length(max_pkts=4)
            rkey, va = self._rkey_va("read", length)
            pkt = Packet(Opcode.READ_REQUEST, psn, ackreq=rng.random() < 0.5,
                         reth=Reth(va, rkey, length))
            self.plan[psn] = pkt
            self.span[psn] = packets(length, mtu)
            return self.span[psn]
        length = self._length()
        n = packets(length, mtu)
        data = self._payload(length)
        lasts, onlys = SEND_OPS[kind]
        end_op = rng.choice(onlys if n == 1 else lasts)
        reth = None
        if kind == "write":
            rkey, va = self._rkey_va("write", length)
            reth = Reth(va, rkey, length)
        imm = rng.randrange(1 << 32)
        inv = (INV_KEY_INDEX << 8) | rng.randrange(256)
        for i in range(n):
            if n == 1:
                op = end_op
            elif i == 0:
                op = Opcode.SEND_FIRST if kind == "send" else Opcode.WRITE_FIRST
            elif i == n - 1:
                op = end_op
            else:
                op = Opcode.SEND_MIDDLE if kind == "send" else Opcode.WRITE_MIDDLE
            pkt = Packet(op, psn_add(psn, i), ackreq=(i == n - 1 and rng.random() < 0.6)
                         or rng.random() < 0.15,
                         payload=data[i * mtu:(i + 1) * mtu])
            if op.has_reth:
                pkt.reth = reth
            if op.has_imm:
                pkt.imm = imm
            if op.has_ieth:
                pkt.ieth = inv
            self.plan[psn_add(psn, i)] = pkt
            self.span[psn_add(psn, i)] = 1
        return n

    def planned(self, psn):
        while psn_diff(psn, self.plan_end) < PSN_MOD // 2 and psn not in self.plan:
            # psn at or past plan_end: extend the plan
            n = self.new_message(self.plan_end)
            self.plan_end = psn_add(self.plan_end, n)
        return self.plan.get(psn)

    def replan(self, psn):
        """Forget the plan from ``psn`` on (a message that cannot succeed)."""
        d_end = psn_diff(self.plan_end, psn)
        for i in range(d_end):
            self.plan.pop(psn_add(psn, i), None)
        self.plan_end = psn

    # --- faulty variants ---

    def faulty(self, pkt, in_msg):
        """A copy of ``pkt`` with one fault the responder must NAK as an invalid request when
        it arrives in sequence (or drop/ACK as a duplicate otherwise)."""
        rng = self.rng
        mtu = self.mtu
        q = Packet(pkt.opcode, pkt.psn, ackreq=pkt.ackreq, payload=pkt.payload, reth=pkt.reth,
                   imm=pkt.imm, ieth=pkt.ieth)
        op = Opcode(pkt.opcode)
        choice = rng.randrange(6)
        if choice == 0:      # opcode out of place (illegal where the responder is)
            q.opcode = rng.choice(ILLEGAL[in_msg])
            if q.opcode.has_reth and q.reth is None:
                q.reth = Reth(0x20000, (MR_INDEX << 8) | MR_TAG, 4 * mtu)
            n = mtu if (q.opcode.is_first or q.opcode.is_middle) else rng.randint(1, mtu)
            q.payload = rng.randbytes(n)
        elif choice == 1 and op is not Opcode.READ_REQUEST:     # FIRST/MIDDLE short, LAST empty
            if op.is_first or op.is_middle:
                q.payload = pkt.payload[:rng.randrange(0, mtu)]
            elif op.is_last:
                q.payload = b""
            else:
                q.payload = rng.randbytes(mtu + 4 * rng.randint(1, 4))
        elif choice == 2 and op is Opcode.READ_REQUEST:         # READ with payload
            q.payload = rng.randbytes(4 * rng.randint(1, 8))
        elif choice == 3 and op.is_write and (op.is_last or op.is_only):
            # WRITE whose packets do not add up to the RETH length
            n = len(pkt.payload)
            alt = [x for x in (n - 1, n + 1, n + 4) if 0 < x <= mtu and x != n]
            if op.is_only:
                alt = [x for x in (n + 1, n + 3, max(0, n - 2)) if x <= mtu and x != n]
            if not alt:
                return None
            q.payload = rng.randbytes(rng.choice(alt))
        elif choice == 4 and op.is_write and op.has_reth and len(pkt.payload) == mtu \
                and op.is_first:
            # FIRST whose RETH says it is all there is
            q.reth = Reth(pkt.reth.va, pkt.reth.rkey, mtu)
        elif choice == 5 and op.is_send and (op.is_last or op.is_only) and pkt.payload:
            q.opcode = Opcode.WRITE_LAST if op.is_last else Opcode.WRITE_ONLY
            if q.opcode.has_reth:
                q.reth = Reth(0x20000, (MR_INDEX << 8) | MR_TAG, len(pkt.payload))
            if not q.opcode.has_imm:
                q.imm = None
            q.ieth = None
        else:
            return None
        return q

    # --- steps ---

    def next(self):
        """The next packet to send and a note saying what it is."""
        rng = self.rng
        self.quiet += 1
        if self.rewind_at is not None:
            psn, left = self.rewind_at
            if left <= 0:
                self.cursor = psn
                self.rewind_at = None
            else:
                self.rewind_at = (psn, left - 1)
        elif self.quiet > 6 and self.cursor != self.model.epsn:
            # nothing heard for a while: the requester's ACK timer goes back to the oldest
            # unacknowledged PSN (the responder's epsn)
            self.cursor = self.model.epsn
            self.quiet = 0
        r = rng.random()
        if r < 0.05 and self.sent:
            # a duplicate of something sent recently
            psn = rng.choice(list(self.sent))
            pkt = self.plan.get(psn)
            if pkt is not None:
                q = Packet(pkt.opcode, pkt.psn, ackreq=rng.random() < 0.5, payload=pkt.payload,
                           reth=pkt.reth, imm=pkt.imm, ieth=pkt.ieth)
                return q, "duplicate"
        if r < 0.07:
            # a stray packet far ahead or behind
            p = self.planned(self.cursor)
            q = Packet(Opcode.SEND_ONLY, psn_add(self.cursor, rng.choice(
                [rng.randint(2, 5000), -rng.randint(100, 1 << 22), 1 << 23, (1 << 23) - 1])),
                ackreq=rng.random() < 0.5, payload=rng.randbytes(rng.randint(0, 16)))
            if p is not None and rng.random() < 0.5:
                q.opcode, q.payload, q.reth, q.imm, q.ieth = (p.opcode, p.payload, p.reth,
                                                              p.imm, p.ieth)
            return q, "stray"
        pkt = self.planned(self.cursor)
        if pkt is None:
            # the cursor is off the plan (it was replanned under it): start again at epsn
            self.cursor = self.model.epsn
            pkt = self.planned(self.cursor)
        if r < 0.12:
            # lost on the way: the next one arrives out of sequence
            self.cursor = psn_add(self.cursor, self.span[pkt.psn])
            pkt = self.planned(self.cursor)
            note = "after a loss"
        else:
            note = "in order"
        if rng.random() < 0.06:
            q = self.faulty(pkt, self.model.in_msg)
            if q is not None:
                return q, "faulty"
        self.sent.append(pkt.psn)
        self.cursor = psn_add(self.cursor, self.span[pkt.psn])
        return pkt, note

    def answer(self, out):
        """Learn from the responder's outputs (a requester's reaction)."""
        if out:
            self.quiet = 0
        for o in out:
            if not isinstance(o, Ack):
                continue
            kind = decode_syndrome(o.syndrome)
            if kind.kind.name == "ACK":
                continue
            if kind.kind.name == "NAK" and int(kind.value) == 2:
                # remote access error: this message can never succeed; plan another from here
                self.replan(o.psn)
                self.cursor = o.psn
            self.rewind_at = (o.psn, self.rng.choice([0, 0, 1, 2, 3]))


class ResponderRun:
    """The responder side: one QP of the core and a ``ResponderModel`` configured alike take
    the same request packets in the same order (:meth:`feed`); what the core sends and
    completes is compared as it comes out, memory and QP state at :meth:`finish`."""

    def __init__(self, b, *, pmtu, ack_coalesce, min_rnr, epsn, msn, known):
        self.b = b
        self.nic = b.nic
        self.mtu = mtu_of(pmtu)
        self.pmtu, self.ack_coalesce, self.min_rnr, self.epsn0, self.msn0 = (
            pmtu, ack_coalesce, min_rnr, epsn, msn)
        self.known = known
        self.model = ResponderModel(int(pmtu), ack_coalesce=ack_coalesce, min_rnr_timer=min_rnr,
                                    epsn=epsn, msn=msn, qp=QP_INDEX)
        self.exp_tx = collections.deque()      # (Packet, what it answers)
        self.exp_cq = collections.deque()
        self.stats = collections.Counter()
        self.posted = 0
        self.fed = 0
        b.tx_handler, b.cq_handler = self.on_tx, self.on_cq

    async def setup(self):
        b, nic = self.b, self.nic
        cfg = QpConfig(pmtu=self.pmtu, timeout=0, min_rnr_timer=self.min_rnr)
        await configure_qp(nic, cfg, sq_psn=0, epsn=self.epsn0)
        await nic.tables.write_qp(QP_INDEX, msn=self.msn0)
        await nic.write_reg("transport.ack_coalesce", self.ack_coalesce)
        b.log.info("responder: pmtu %d (%d bytes), ack_coalesce %d, min_rnr_timer %d, epsn %#x, "
                   "msn %#x", int(self.pmtu), self.mtu, self.ack_coalesce, self.min_rnr,
                   self.epsn0, self.msn0)

    def on_tx(self, pkt):
        b = self.b
        self.stats["tx_compared"] += 1
        if not self.exp_tx:
            b.fail(f"core sent {show(pkt)}; the model sends nothing")
            return
        want, why = self.exp_tx.popleft()
        if fields(pkt) != fields(want):
            b.fail(f"core sent {show(pkt)}\n  model sends {show(want)} (answer to {why})")

    def on_cq(self, c):
        b = self.b
        self.stats["cq_compared"] += 1
        if not self.exp_cq:
            b.fail(f"core completed {c}; the model completes nothing")
            return
        want = self.exp_cq.popleft()
        if cqe_key(c) != cqe_key(want):
            b.fail(f"core completed {c}\n  model completes {want}")

    def read_source(self, resp):
        """READ responses read host memory at the bus addresses the region maps the va to."""
        b = self.b
        return SimpleNamespace(read=lambda a, n: b"".join(
            b.mirror.read(addr, k) for addr, k in b.mr.spans(a, n)))

    async def quiesce(self):
        """Every packet fed has been taken and answered."""
        b = self.b
        await b.rx_idle()
        await ClockCycles(b.dut.clk, 300)
        await b.wait_until(lambda: not self.exp_tx and not self.exp_cq, 100_000,
                           "the core's answers")
        await ClockCycles(b.dut.clk, 50)
        b.check()

    async def post_receives(self, lengths):
        """Post receive WQEs (when the core is idle: a receive must not overtake a SEND)."""
        b, model = self.b, self.model
        await self.quiesce()
        # the core holds rq_depth (16) receive WQEs, the one a SEND is filling included
        room = 12 - len(model.rq) - (model.cur_recv is not None)
        for length in lengths[:max(room, 0)]:
            self.posted += 1
            slots = 0x60000 // (4 * self.mtu)       # receive buffers in [0x90000, 0xF0000)
            rr = RecvRequest(qp=QP_INDEX, wr_id=0x5EC0_0000 + self.posted,
                             addr=0x90000 + (self.posted % slots) * 4 * self.mtu, length=length)
            model.post_recv(rr)
            await self.nic.post_recv(rr)
            b.note(f"posted receive {rr.wr_id:#x} of {length} bytes")
        await b.wait_until(lambda: self.nic.rr_source.idle(), 10_000, "receive posts")
        await ClockCycles(b.dut.clk, 20)

    async def set_state(self, state):
        """The host moves the QP (only RTR and RTS take requests; RESET and INIT, which would
        reset the transport state, are not used)."""
        await self.quiesce()
        await self.nic.tables.write_qp(QP_INDEX, state=state)
        self.model.state = state
        self.b.note(f"QP state {QpState(state).name}")
        self.stats["state_changes"] += 1

    async def feed(self, pkt, note="scripted"):
        """One request packet into the core and the model; returns the model's outputs."""
        b, model, mtu = self.b, self.model, self.mtu
        if pkt.opcode == Opcode.READ_REQUEST and pkt.payload:
            # The packet engine drops it as malformed (the header table gives READ requests no
            # payload; DESIGN.md: bad input is dropped and counted) before the transport sees
            # it: the contract's "READ_REQUEST carries 0" NAK cannot happen. Not fed to the model.
            out = []
            note = "malformed"
        else:
            out = model.receive(pkt, b.mr.check_packet)
        self.stats[note] += 1
        b.note(f"fed {show(pkt)} ({note}) -> " + (", ".join(_out_str(o) for o in out) or "-"))
        writes = [o for o in out if isinstance(o, MemWrite)]
        reads_owed = lambda: any(p.opcode != Opcode.ACKNOWLEDGE for p, _ in self.exp_tx)  # noqa: E731
        if writes and reads_owed():
            # a READ response still owed reads memory this packet writes: let it go first
            await b.wait_until(lambda: not reads_owed(), 100_000,
                               "READ responses before a memory write")
        for w in writes:
            if w.recv is not None:
                b.mirror.write(w.addr, w.data)
                continue
            k = 0
            for addr, n in b.mr.spans(w.addr, len(w.data)):
                b.mirror.write(addr, w.data[k:k + n])
                k += n
        for o in out:
            if isinstance(o, Ack):
                self.exp_tx.append((o.packet(REMOTE_QPN), show(pkt)))
            elif isinstance(o, ReadResponse):
                for rp in read_response_packets(o, mtu, self.read_source(o), qp=REMOTE_QPN):
                    self.exp_tx.append((rp, show(pkt)))
            elif isinstance(o, Completion):
                self.exp_cq.append(o)
        self.fed += 1
        await b.send_frame(to_frame(pkt, dest_qp=QPN, udp_sport=0xC000 + (self.fed & 0xFF)))
        return out

    async def finish(self):
        """Everything answered; host memory, QP context and counters against the model."""
        b, nic, model, stats = self.b, self.nic, self.model, self.stats
        await self.quiesce()
        await ClockCycles(b.dut.clk, 500)
        b.check()
        # host memory: same bytes, each written as often as the model wrote it
        got = nic.mem.write_map()
        want = dict(b.mirror.counts)
        if got != want:
            extra = sorted(a for a in got if got[a] != want.get(a))
            missing = sorted(a for a in want if want[a] != got.get(a))
            raise Mismatch(f"seed {b.seed}: DMA writes differ from the model's: bytes written "
                           f"differently {extra[:8]}..., not written {missing[:8]}...")
        if nic.mem.read(0, MEM_SIZE) != bytes(b.mirror.data):
            diff = next(i for i in range(MEM_SIZE) if nic.mem.read(i, 1)[0] != b.mirror.data[i])
            raise Mismatch(f"seed {b.seed}: host memory differs from the model first at {diff:#x}")
        ctx = await nic.tables.read_qp(QP_INDEX)
        assert (ctx["epsn"], ctx["msn"], ctx["state"]) == (model.epsn, model.msn, model.state), \
            (f"seed {b.seed}: QP context epsn {ctx['epsn']:#x} msn {ctx['msn']} state "
             f"{ctx['state']}; model epsn {model.epsn:#x} msn {model.msn}")
        counters = await nic.counters()
        b.log.info("transport counters: %s", counters)
        b.log.info("model counts: %s", dict(model.counts))
        b.log.info("responder: %d packets fed (%s), %d frames and %d completions compared, "
                   "%d bytes of host memory written", self.fed, dict(stats), stats["tx_compared"],
                   stats["cq_compared"], len(got))
        assert counters["rx_requests"] == model.counts["accepted"]
        assert counters["rx_duplicates"] == model.counts["duplicate"]
        assert counters["rx_out_of_sequence"] == model.counts["out_of_sequence"]
        assert counters["rx_drop_state"] == model.counts["drop_state"]


@cocotb.test()
async def responder(dut):
    """Random request packets into one QP; outputs, completions, memory and QP state against
    ``ResponderModel``."""
    steps = tb_param("steps", int, 300)
    b = Bench(dut, pause=tb_param("pause", float, 0.2))
    rng = b.rng
    pmtu = PathMtu(tb_param("pmtu", int, 1))
    await b.start()
    near_wrap = rng.random() < 0.5
    known = known_cases()
    coalesce = [1, 2, 3, 4, 16] + [0] * known["ack_coalesce_zero"]
    r = ResponderRun(b, pmtu=pmtu, ack_coalesce=rng.choice(coalesce),
                     min_rnr=rng.randint(1, 31),
                     epsn=(PSN_MOD - rng.randint(1, 40)) if near_wrap else rng.randrange(PSN_MOD),
                     msn=rng.choice([0, rng.randrange(PSN_MOD), PSN_MOD - rng.randint(1, 20)]),
                     known=known)
    await r.setup()
    model, mtu = r.model, r.mtu
    drv = RequestDriver(rng, mtu, model.epsn, b.mr, model, r.known)

    def lengths(k):
        # mostly room for any message; sometimes less than one MTU (too small for most)
        return [rng.randint(0, mtu - 1) if rng.random() < 0.1 else rng.randint(3 * mtu, 4 * mtu)
                for _ in range(k)]

    accepting = (QpState.RTR, QpState.RTS)
    await r.post_receives(lengths(rng.randint(0, 4)))
    for _ in range(steps):
        b.check()
        if model.state not in accepting:
            if rng.random() < 0.1:
                await r.set_state(rng.choice(accepting))
        elif rng.random() < 0.01:
            await r.set_state(rng.choice([QpState.RTR, QpState.RTS, QpState.SQD, QpState.SQE,
                                          QpState.ERROR]))
        elif rng.random() < 0.06 or (len(model.rq) == 0 and rng.random() < 0.15):
            await r.post_receives(lengths(rng.randint(1, 4)))
        pkt, note = drv.next()
        drv.answer(await r.feed(pkt, note))
    await r.finish()


def _out_str(o):
    if isinstance(o, Ack):
        return str(o.packet())
    if isinstance(o, ReadResponse):
        return f"READ resp psn {o.psn:#x} {o.length}B"
    if isinstance(o, MemWrite):
        return f"write {len(o.data)}B @{o.addr:#x}"
    if isinstance(o, Completion):
        return f"cqe {o.wr_id:#x} {WcStatus(o.status).name}"
    return str(o)


# --------------------------------------------------------------------------------------------
# 2. Requester: random work requests, the testbench as the remote responder
# --------------------------------------------------------------------------------------------

GOOD_RKEY = 0x0177
BAD_RKEY = 0x0178
RMEM_SIZE = 1 << 18
SRC_AREA = (0x10000, 0x80000)       # payload of SEND/WRITE work requests (never written)
RDST_AREA = (0x80000, 0xF0000)      # READ destinations (each byte written once)
TICK_US = 4.096                     # the timer tick the core's RNR table assumes


class RtlTimer:
    """A lower bound on when the core's per-QP timer can expire, from what the testbench saw
    (all times in clock cycles).

    The core (``engine.py``) keeps one timer word per QP: a send arms it when it is not armed
    (deadline now + 2**timeout + 1 ticks), progress (una advancing) re-arms it or disarms it when
    nothing is outstanding, an RNR NAK sets it to the RNR delay, an expiry, a fatal error and
    the end of an RNR wait disarm it; go-back-N after a NAK or a lost READ leaves it alone. The
    testbench follows those rules with the earliest time each arming can have happened (a send:
    ``send_latency`` before its frame was seen; a response: when it started to go in), so
    ``lb + lo`` is the earliest expiry and ``now + hi`` the latest."""

    def __init__(self, tick, timeout, send_latency):
        self.tick = tick
        self.ack = ((1 << timeout) * tick, ((1 << timeout) + 2) * tick + 64)
        self.send_latency = send_latency
        self.armed = False
        self.kind = None
        self.lb = 0
        self.lo = self.hi = 0

    def _set(self, kind, lb, lo, hi):
        self.armed, self.kind, self.lb, self.lo, self.hi = True, kind, lb, lo, hi

    def sent(self, t):
        if not self.armed:
            self._set("ack", t - self.send_latency, *self.ack)

    def progress(self, t, outstanding):
        if outstanding:
            self._set("ack", t, *self.ack)
        else:
            self.disarm()

    def rnr(self, t, code):
        ticks = -(-int(RNR_TIMER_US[code] * 1000) // int(TICK_US * 1000))
        self._set("rnr", t, ticks * self.tick, (ticks + 2) * self.tick + 64)

    def disarm(self):
        self.armed = False

    def may_expire_before(self, t):
        return self.armed and t >= self.lb + self.lo


def model_receive(model, pkt):
    """``model.receive(pkt)``, working around a model defect (M1): ``RequesterModel._ack``
    walks into a WQE that has not been sent yet (``first_psn`` None) and raises TypeError when
    an ACK covers every packet sent while a later work request waits for the window. The
    contract's walk stops there, so the unsent WQEs (always the tail of the send queue) are
    kept out of the walk; if the packet is fatal they are flushed after the others, as the
    model's ``_fatal`` would have done."""
    k = next((i for i, w in enumerate(model.sq) if w.first_psn is None), len(model.sq))
    hidden = model.sq[k:]
    del model.sq[k:]
    out = model.receive(pkt)
    if model.error and hidden:
        out += [Completion(model.qp, w.wr.wr_id, WcStatus.WR_FLUSH_ERR, wc_opcode(w.wr.opcode))
                for w in hidden]
    elif not model.error:
        model.sq.extend(hidden)
    return out


def rtl_takes_read_response(model, pkt):
    """Whether the core takes READ response ``pkt`` (``engine.py``, its documented rule): once
    the SEND/WRITE WQEs before it are acknowledged by it, its PSN must be una, inside the oldest
    WQE, a READ; the opcode must fit its position -- LAST/ONLY exactly for the last bytes of the
    READ, FIRST/ONLY at the first byte, FIRST or MIDDLE elsewhere (a re-request from the middle
    of a READ is answered with a FIRST) -- and the payload be an MTU, or what is left."""
    p = pkt.psn
    una = model.una
    for w in model.sq:
        if w.is_read or w.first_psn is None or not psn_behind(w.last_psn, p):
            break
        una = psn_add(w.last_psn, 1)
    else:
        return False
    if p != una or not w.is_read or not w.contains(p):
        return False
    off = psn_diff(p, w.first_psn) * model.mtu
    rem = w.wr.size - off
    last = rem <= model.mtu
    op = Opcode(pkt.opcode)
    starts = op in (Opcode.READ_RESP_FIRST, Opcode.READ_RESP_ONLY)
    ends = op in (Opcode.READ_RESP_LAST, Opcode.READ_RESP_ONLY)
    return ends == last and (off != 0 or starts) and pkt.length == (rem if last else model.mtu)


class RequesterRun:
    """One QP's run ("episode") on the requester side: the core and ``RequesterModel`` side by
    side, the testbench being the wire and the remote responder (see the module docstring)."""

    def __init__(self, b, *, qp_index, qpn, pmtu, window, shift, timeout, tick, guard,
                 retry_cnt, rnr_retry, sq_psn, rmem, rdst, stats, known, send_latency):
        rng = self.rng = b.rng
        self.b = b
        self.nic = b.nic
        self.qp_index, self.qpn = qp_index, qpn
        self.pmtu, self.mtu = pmtu, mtu_of(pmtu)
        self.guard = guard
        self.rmem, self.rdst, self.stats, self.known = rmem, rdst, stats, known
        self.model = RequesterModel(int(pmtu), window=window, ack_every=1 << shift,
                                    retry_cnt=retry_cnt, rnr_retry=rnr_retry, timeout=timeout,
                                    sq_psn=sq_psn, qp=qp_index, mem=b.nic.mem)
        self.remote = ResponderModel(int(pmtu), ack_coalesce=rng.choice([1, 2, 4]),
                                     min_rnr_timer=rng.choice([1, 2, 3, 4]), epsn=sq_psn)
        self.p_req_drop = rng.choice([0.0, 0.02, 0.08])
        self.p_resp_drop = rng.choice([0.0, 0.03, 0.1])
        self.p_dup = rng.choice([0.0, 0.03])
        self.wrs_left = rng.randint(10, 40)
        self.timer = RtlTimer(tick, timeout, send_latency=send_latency)
        self.captured = collections.deque()     # (Packet, cycle) the core sent, not yet matched
        self.exp = collections.deque()          # what the model sends, not yet matched
        self.got_cq = collections.deque()
        self.exp_cq = collections.deque()
        self.to_remote = collections.deque()    # request packets on the wire
        self.to_local = collections.deque()     # response packets on the wire
        self.retry_cnt = retry_cnt
        # The core's own view where it departs from the contract (D2, D3 in KNOWN): its
        # "rewound for a lost READ" flag and its retry budget.
        self.lost_rd = False
        self.rtl_retry = retry_cnt
        self.ended = None                       # a KNOWN case ended the run here
        self.hpsn = sq_psn                      # one past the highest PSN the core sent
        self.p_delay = rng.choice([0.0, 0.0, 0.05])
        self.held = []                          # [responses to go, packet]: reordered ones
        self.clean = False                      # no random impairments (directed runs)
        self.rnr_hi = 0                         # latest end of the current RNR delay
        b.tx_handler = lambda pkt: self.captured.append((pkt, self.now()))
        b.cq_handler = self.got_cq.append
        b.log.info("QP %d: sq_psn %#x, retry_cnt %d, rnr_retry %d, remote ack_coalesce %d, "
                   "min_rnr_timer %d, drops %.2f/%.2f, dup %.2f, %d work requests", qp_index,
                   sq_psn, retry_cnt, rnr_retry, self.remote.ack_coalesce,
                   self.remote.min_rnr_timer, self.p_req_drop, self.p_resp_drop, self.p_dup,
                   self.wrs_left)

    def now(self):
        return int(cocotb.utils.get_sim_time("ns") / self.b.period_ns)

    def match(self):
        """Pair what the core sent with what the model predicted; True when every prediction
        is met."""
        b, stats = self.b, self.stats
        while self.captured and self.exp:
            (got, t), want = self.captured.popleft(), self.exp.popleft()
            stats["tx_compared"] += 1
            self.timer.sent(t)
            if fields(got) != fields(want):
                b.fail(f"core sent {show(got)}\n  model sends {show(want)}")
            b.note(f"core sent {show(got)}")
            self.to_remote.append(got)
        while self.got_cq and self.exp_cq:
            got, want = self.got_cq.popleft(), self.exp_cq.popleft()
            stats["cq_compared"] += 1
            if cqe_key(got, requester=True) != cqe_key(want, requester=True):
                b.fail(f"core completed {got}\n  model completes {want}")
            b.note(f"core completed {got.wr_id:#x} {WcStatus(got.status).name}")
        return not self.exp and not self.exp_cq

    def take(self, out):
        for o in out:
            if isinstance(o, Completion):
                self.exp_cq.append(o)
            elif isinstance(o, MemWrite):
                self.b.mirror.write(o.addr, o.data)

    async def settle(self):
        """The model sends all it can; the core must send the same."""
        while (pkt := self.model.next_packet()) is not None:
            self.exp.append(pkt)
        if psn_ahead(self.model.npsn, self.hpsn):
            self.hpsn = self.model.npsn
        timer = self.timer
        t0 = self.now()
        # (a completion the model does not predict ends the wait: it will not come right)
        await self.b.wait_until(lambda: self.match() or (self.got_cq and not self.exp_cq),
                                200_000, "the core's requests and completions")
        if self.got_cq and not self.exp_cq:
            self.b.fail(f"core completed {self.got_cq[0]}; the model completes nothing, it "
                        f"sends {[show(p) for p in self.exp]}")
        if timer.armed and self.now() >= timer.lb + timer.lo > t0:
            self.b.fail(f"the core's timer could expire before it sent what the model predicts "
                        f"(it sent less, or slower than the guard time allows); model: "
                        f"{[show(p) for p in self.exp] or 'sent'}, core: "
                        f"{[show(p) for p, _ in self.captured]}")
        self.b.check()

    async def guarded(self):
        """Before anything goes into the core: if its timer could expire meanwhile, let it
        expire first."""
        if self.timer.may_expire_before(self.now() + self.guard):
            await self.timer_event()

    async def timer_event(self):
        """Wait for the core's timer to act: a packet or completion the model did not predict.
        The model's ``timeout()`` / ``rnr_expired()`` is called there."""
        b, model, timer = self.b, self.model, self.timer
        longest = max(timer.hi if timer.armed else 0, timer.ack[1],
                      self.rnr_hi if model.rnr_wait else 0)
        limit = self.now() + longest + 200
        await b.wait_until(lambda: self.captured or self.got_cq or self.now() > limit, 400_000,
                           "a timer expiry")
        await ClockCycles(b.dut.clk, 20)
        if not self.captured and not self.got_cq:
            if (model.outstanding and not model.error) or model.rnr_wait:
                b.fail(f"the core did not act on its timer (model: una {model.una:#x}, "
                       f"npsn {model.npsn:#x}, rnr_wait {model.rnr_wait})")
                b.check()
            timer.disarm()
            return
        if model.rnr_wait:
            kind = "RNR wait over"
            out = model.rnr_expired()
            self.stats["rnr_expiries"] += 1
        else:
            kind = "ACK timeout"
            if self.rtl_retry == 0 < model.retry_left and not self.known["lost_read_retry"]:
                await self.end_known("lost_read_retry", "ACK timeout", [])
                return
            self.rtl_retry = max(self.rtl_retry - 1, 0)
            out = model.timeout()
            self.stats["timeouts"] += 1
        b.note(f"{kind} -> " + (", ".join(_out_str(o) for o in out) or "-"))
        timer.disarm()
        self.take(out)
        if self.captured and self.captured[0][0].psn != model.una:
            b.fail(f"core sent {show(self.captured[0][0])} unprompted; not a retransmission "
                   f"from una {model.una:#x}")
        await self.settle()

    async def post_wr(self, seq, wr=None):
        self.wrs_left -= 1
        if wr is None:
            wr = random_wr(self.rng, seq, self.mtu, self.rdst)
        wr.qp = self.qp_index
        await self.b.responses_processed()
        await self.guarded()
        if self.ended:
            return                  # the timer ended the run (a KNOWN case)
        self.take(self.model.post(wr))
        self.b.note(f"post {wr.opcode.name} {wr.size}B wr_id {wr.wr_id:#x}"
                    f"{' inline' if wr.inline is not None else ''}"
                    f"{'' if wr.signaled else ' unsignaled'}")
        await self.nic.post_send(wr)
        self.stats["posted"] += 1
        await self.settle()

    def remote_mr_ok(self, pkt):
        return pkt.reth.rkey == GOOD_RKEY and pkt.reth.va + pkt.reth.dma_len <= RMEM_SIZE

    def remote_step(self):
        """The remote responder takes the oldest request on the wire (or the wire loses it)."""
        rng, stats = self.rng, self.stats
        pkt = self.to_remote.popleft()
        if rng.random() < self.p_req_drop:
            self.b.note(f"lost request {pkt.psn:#x}")
            stats["requests_lost"] += 1
            return
        out = self.remote.receive(pkt, self.remote_mr_ok)
        for o in out:
            if isinstance(o, MemWrite):
                self.rmem.write(o.addr, o.data)
        for rp in response_packets(out, self.mtu, self.rmem, qp=self.qpn):
            if self.clean:
                self.to_local.append(rp)
                continue
            if rp.aeth is not None and rp.aeth.syndrome == 0x1F and rng.random() < 0.1:
                # an ACK with a credit count (AETH bits 4:0) other than "not used": still an ACK
                rp.aeth = Aeth(rng.randrange(0x1F), rp.aeth.msn)
            if rp.opcode == Opcode.ACKNOWLEDGE and rng.random() < 0.004:
                # a remote operational error, or a reserved NAK code (the model responder never
                # sends one; both complete as REM_OP_ERR)
                rp.aeth = Aeth(nak_syndrome(rng.choice([NakCode.REM_OP, rng.randint(4, 31)])),
                               rp.aeth.msn)
            if rp.opcode == Opcode.ACKNOWLEDGE and rng.random() < 0.01:
                # a reserved syndrome (bits 6:5 = 10, or bit 7 set): ignored
                rp.aeth = Aeth(rng.choice([0x40, 0x5F, 0x80, 0x9F, 0xE0]), rp.aeth.msn)
            if rng.random() < self.p_resp_drop:
                stats["responses_lost"] += 1
                continue
            if rng.random() < self.p_delay:
                # overtaken by the next few responses (reordering)
                self.held.append([rng.randint(1, 6), rp])
                stats["responses_delayed"] += 1
                continue
            self.to_local.append(rp)
            if rng.random() < self.p_dup:
                self.to_local.append(rp)
        if rng.random() < 0.02 and not self.clean:
            # a ghost: an ACK for a PSN long acknowledged
            self.to_local.append(Packet(Opcode.ACKNOWLEDGE,
                                        psn_add(self.model.una, -rng.randint(1, 1000)),
                                        aeth=Aeth(0x1F, rng.randrange(1 << 24))))

    def trial(self, pkt):
        """What the model would do with ``pkt`` (a copy of it takes the packet)."""
        mem, self.model.mem = self.model.mem, None
        try:
            m = copy.deepcopy(self.model)
        finally:
            self.model.mem = mem
        model_receive(m, pkt)
        return m

    async def local_step(self):
        """The core (and the model) take the oldest response on the wire."""
        model, timer, known = self.model, self.timer, self.known
        rp = self.to_local.popleft()
        for h in self.held:
            h[0] -= 1
        self.to_local.extend(h[1] for h in self.held if h[0] <= 0)
        self.held = [h for h in self.held if h[0] > 0]
        # the core's timer goes first if it may (it changes what the response will do)
        await self.guarded()
        if self.ended:
            return
        t = self.trial(rp)
        c0, c1 = model.counts, t.counts
        op = Opcode(rp.opcode)
        valid = psn_diff(rp.psn, model.una) < model.outstanding
        if valid != (psn_diff(rp.psn, model.una) < psn_diff(self.hpsn, model.una)) \
                and not known["hpsn_window"]:
            self.b.note(f"lost {show(rp)} (D7: between npsn and hpsn)")
            self.stats["D7_avoided"] += 1
            return
        if op.is_read_response and valid and not known["read_position"] \
                and (c1["read_resp"] > c0["read_resp"]) != rtl_takes_read_response(model, rp):
            self.b.note(f"lost {show(rp)} (D6: the core and the model place it differently)")
            self.stats["D6_avoided"] += 1
            return
        moved = t.una != model.una
        read_rw = c1["read_rewind"] > c0["read_rewind"]
        seq_rw = not read_rw and c1["rewind"] > c0["rewind"] and c1["nak_seq"] > c0["nak_seq"]
        rtl_eff = self.retry_cnt if moved else self.rtl_retry
        if read_rw and t.error and not known["fatal_nak_past_read"]:
            self.b.note(f"lost {show(rp)} (D4: a fatal NAK past a READ with lost responses)")
            self.stats["D4_avoided"] += 1
            return
        if read_rw and self.lost_rd and not known["lost_read_once"]:
            self.b.note(f"lost {show(rp)} (D2: a second lost-READ rewind without progress)")
            self.stats["D2_avoided"] += 1
            return
        if (read_rw or (seq_rw and not t.error)) and rtl_eff == 0 \
                and not known["lost_read_retry"]:
            await self.end_known("lost_read_retry", show(rp), [rp])
            return
        t0 = self.now()
        una0, rewinds0, rnr0 = model.una, model.counts["rewind"], model.counts["rnr_nak"]
        out = model_receive(model, rp)
        self.b.note(f"fed {show(rp)} -> " + (", ".join(_out_str(o) for o in out) or "-"))
        self.stats["responses_fed"] += 1
        self.take(out)
        if read_rw:
            self.rtl_retry, self.lost_rd = rtl_eff - 1, True
        elif seq_rw:
            self.rtl_retry, self.lost_rd = max(rtl_eff - 1, 0), False
        elif moved:
            self.rtl_retry, self.lost_rd = self.retry_cnt, False
        if model.error:
            timer.disarm()
        elif model.rnr_wait and model.counts["rnr_nak"] != rnr0:
            timer.rnr(t0, rp.aeth.syndrome & 0x1F)
            self.rnr_hi = timer.hi
        elif model.counts["rewind"] != rewinds0:
            pass                    # go-back-N after a NAK or a lost READ: timer unchanged
        elif model.una != una0:
            timer.progress(t0, model.npsn != model.una)
        await self.feed(rp)
        await self.settle()

    async def feed(self, rp):
        self.b.responses_fed += 1
        await self.b.send_frame(to_frame(rp, dest_qp=self.qpn))

    async def end_known(self, case, what, feed):
        """A KNOWN divergence decides the run from here (the core fails the QP with
        RETRY_EXC_ERR where the model would go on): feed the model what the core gets (for the
        completions of what it acknowledges), expect the core's fatal error for the oldest WQE
        left and flushes for the others, and stop comparing with the model."""
        model = self.model
        for rp in feed:
            self.take(model_receive(model, rp))
        self.b.note(f"{case}: the core fails the QP at {what}; the model would go on")
        self.stats[f"{case}_ended"] += 1
        for i, w in enumerate(model.sq):
            self.exp_cq.append(Completion(self.qp_index, w.wr.wr_id,
                                          WcStatus.RETRY_EXC_ERR if i == 0 else WcStatus.WR_FLUSH_ERR,
                                          wc_opcode(w.wr.opcode)))
        self.ended = case
        for rp in feed:
            await self.feed(rp)
        self.to_local.clear()
        self.to_remote.clear()
        self.held = []
        self.exp.clear()

    def post_receives(self):
        """The remote application posts receives now and then (none: RNR NAKs)."""
        rng, remote = self.rng, self.remote
        if len(remote.rq) < 2 and rng.random() < (0.5 if self.model.rnr_wait else 0.2):
            for _ in range(rng.randint(1, 3)):
                length = rng.randint(0, self.mtu - 1) if rng.random() < 0.01 else 5 * self.mtu
                remote.post_recv(RecvRequest(qp=0, wr_id=0, addr=rng.randrange(
                    0, RMEM_SIZE - length), length=length))

    async def run(self, next_seq, steps):
        """Until every work request completed or the QP failed (or ``steps`` events)."""
        b, model, rng = self.b, self.model, self.rng
        done = 0
        while True:
            b.check()
            self.match()
            if self.captured or self.got_cq:
                await self.timer_event()
                continue
            self.post_receives()
            choices = []
            if self.wrs_left > 0 and len(model.sq) < 14 and not model.error and done < steps:
                choices.append(("post", 2))
            if self.to_remote:
                choices.append(("remote", 3))
            if not self.to_local and self.held and not self.to_remote:
                self.to_local.extend(h[1] for h in self.held)      # nothing left to overtake
                self.held = []
            if self.to_local:
                choices.append(("local", 3))
            done += 1
            if self.ended:
                break
            if not choices:
                if model.error or model.idle:
                    break
                await self.timer_event()        # everything in flight was lost
                continue
            what = rng.choices([c for c, _ in choices], [w for _, w in choices])[0]
            if what == "post":
                await self.post_wr(next_seq())
            elif what == "remote":
                self.remote_step()
            else:
                await self.local_step()
        if model.error and not self.ended:
            # posts to a QP in error complete with WR_FLUSH_ERR
            for _ in range(rng.randint(0, 2)):
                await self.post_wr(next_seq())
        await self.finish()
        b.log.info("QP %d done after %d events: %s; model counts %s", self.qp_index, done,
                   "in ERROR" if model.error else "all completed", dict(model.counts))
        return done

    async def finish(self):
        """No packet or completion left over; the QP context's state is the model's."""
        b, model = self.b, self.model
        await b.wait_until(self.match, 100_000, "the last completions")
        await ClockCycles(b.dut.clk, 300)
        self.match()
        if self.captured or self.got_cq:
            b.fail(f"core sent {len(self.captured)} packets and {len(self.got_cq)} completions "
                   f"after the run: {[show(p) for p, _ in self.captured]} {list(self.got_cq)}")
        b.check()
        ctx = await self.nic.tables.read_qp(self.qp_index)
        want_state = QpState.ERROR if model.error or self.ended else QpState.RTS
        assert ctx["state"] == want_state, \
            f"seed {b.seed}: QP {self.qp_index} state {ctx['state']}, model: {want_state.name}"
        await b.responses_processed()       # none still on its way to the flow entry
        await self.nic.tables.delete_flow(0, self.qpn)
        self.stats["runs"] += 1
        self.stats["fatal"] += model.error

    async def script(self, actions):
        """A directed run: ``("post", WorkRequest)``; ``"remote"`` / ``"remote_lose"`` (the
        remote takes / the wire loses the oldest request); ``"local"`` / ``"local_lose"`` /
        ``"local_hold"`` (the core takes / the wire loses / holds back the oldest response);
        ``"release"`` (held responses go first); ``"timer"`` (wait for the core's timer);
        ``("mutate", syndrome)`` (the oldest response gets that AETH syndrome);
        ``"remote_recv"`` (the remote application posts a receive);
        ``"settle"`` (the remote and the core exchange everything left, nothing lost)."""
        for i, a in enumerate(actions):
            self.b.check()
            kind, arg = (a, None) if isinstance(a, str) else a
            if kind == "post":
                await self.post_wr(i, arg)
            elif kind in ("remote", "remote_lose"):
                self.p_req_drop = 1.0 if kind == "remote_lose" else 0.0
                self.remote_step()
            elif kind == "local":
                await self.local_step()
            elif kind == "local_lose":
                self.b.note(f"lost {show(self.to_local.popleft())}")
            elif kind == "local_hold":
                self.held.append([1 << 30, self.to_local.popleft()])
            elif kind == "release":
                self.to_local.extendleft(reversed([h[1] for h in self.held]))
                self.held = []
            elif kind == "timer":
                await self.timer_event()
            elif kind == "remote_recv":
                self.remote.post_recv(RecvRequest(qp=0, wr_id=0, addr=0x8000, length=4096))
            elif kind == "mutate":
                rp = self.to_local[0]
                rp.aeth = Aeth(arg, rp.aeth.msn)
            elif kind == "settle":
                self.p_req_drop = 0.0
                while self.to_remote or self.to_local:
                    if self.to_local:
                        await self.local_step()
                    else:
                        self.remote_step()
            self.match()
        await self.finish()


async def requester_bench(dut, *, window=None, shift=None):
    """A started bench with the requester CSRs set (random unless given)."""
    b = Bench(dut, pause=tb_param("pause", float, 0.2))
    rng = b.rng
    await b.start()
    b.pmtu = PathMtu(tb_param("pmtu", int, 1))
    b.tick, b.timeout = 64, 7
    b.window = window or rng.choice([4, 8, 16])
    b.shift = shift or rng.choice([1, 2, 3])
    for reg, v in (("tick_cycles", b.tick), ("window", b.window), ("ackreq_shift", b.shift)):
        await b.nic.write_reg(f"transport.{reg}", v)
    b.log.info("requester: pmtu %d, window %d, AckReq every %d PSNs, tick %d cycles, timeout %d",
               int(b.pmtu), b.window, 1 << b.shift, b.tick, b.timeout)
    b.rmem = Mirror(rng.randbytes(RMEM_SIZE))
    b.rdst = [RDST_AREA[0]]
    b.stats = collections.Counter()
    b.runs = 0
    return b


async def requester_run(b, *, retry_cnt, rnr_retry, sq_psn, known=None):
    """A fresh QP (index, number, remote QPN) in RTS and its ``RequesterRun``."""
    b.runs += 1
    qp_index, qpn = 1 + b.runs % 15, QPN + b.runs
    b.remote_qpn = REMOTE_QPN + b.runs
    cfg = QpConfig(pmtu=b.pmtu, timeout=b.timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry)
    await b.nic.create_qp(qp_index, qpn, peer=PEER, remote_qpn=b.remote_qpn, cfg=cfg,
                          sq_psn=sq_psn, rq_psn=0)
    beats = (mtu_of(b.pmtu) + 100) // (b.width // 8) + 1
    return RequesterRun(b, qp_index=qp_index, qpn=qpn, pmtu=b.pmtu, window=b.window,
                        shift=b.shift, timeout=b.timeout, tick=b.tick,
                        guard=3000 + 4 * beats * b.window, retry_cnt=retry_cnt,
                        rnr_retry=rnr_retry, sq_psn=sq_psn, rmem=b.rmem, rdst=b.rdst,
                        stats=b.stats, known=known or known_cases(),
                        send_latency=600 + 4 * beats)


def check_read_data(b):
    """READ data landed once per byte, where and as the model wrote it."""
    got = b.nic.mem.write_map()
    want = dict(b.mirror.counts)
    if got != want:
        extra = sorted(a for a in got if got[a] != want.get(a))
        missing = sorted(a for a in want if want[a] != got.get(a))
        raise Mismatch(f"seed {b.seed}: READ data writes differ from the model's: bytes written "
                       f"differently {extra[:8]}..., not written {missing[:8]}...")
    lo, hi = RDST_AREA
    assert b.nic.mem.read(lo, hi - lo) == bytes(b.mirror.data[lo:hi]), f"seed {b.seed}: READ data"


@cocotb.test()
async def requester(dut):
    """Random work requests; every request frame against ``RequesterModel.next_packet()``, the
    testbench answering as a scripted lossy remote responder; completions, READ data and QP
    state against the model."""
    steps = tb_param("steps", int, 400)
    b = await requester_bench(dut)
    rng = b.rng
    seq = [0]

    def next_seq():
        seq[0] += 1
        return seq[0]

    while steps > 0:
        near_wrap = rng.random() < 0.4
        r = await requester_run(
            b, retry_cnt=rng.choice([2, 3, 7]), rnr_retry=rng.choice([1, 3, 7]),
            sq_psn=(PSN_MOD - rng.randint(1, 30)) if near_wrap else rng.randrange(PSN_MOD))
        steps -= await r.run(next_seq, steps)
    check_read_data(b)
    b.log.info("transport counters: %s", await b.nic.counters())
    b.log.info("requester: %s", dict(b.stats))


def random_wr(rng, seq, mtu, rdst):
    """A random work request (opcode, length, inline, signaled, rkey)."""
    op = rng.choices([WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND,
                      WrOpcode.SEND_WITH_IMM, WrOpcode.SEND_WITH_INV, WrOpcode.RDMA_READ],
                     [4, 1, 3, 1, 1, 3])[0]
    r = rng.random()
    if r < 0.1:
        n = 0
    elif r < 0.5:
        n = rng.randint(1, mtu)
    elif r < 0.6:
        n = mtu * rng.randint(1, 4)
    else:
        n = rng.randint(1, 4 * mtu)
    wr = WorkRequest(qp=0, wr_id=(0x77 << 40) | seq, opcode=op, rkey=GOOD_RKEY,
                     imm=rng.randrange(1 << 32), invalidate_rkey=(INV_KEY_INDEX << 8) | 1,
                     signaled=rng.random() < 0.85, raddr=rng.randrange(0, RMEM_SIZE - n))
    if op.is_read:
        wr.laddr = rdst[0]
        rdst[0] += max(n, 1)
        assert rdst[0] <= RDST_AREA[1], "READ destination area exhausted"
    elif n <= 32 and rng.random() < 0.4:
        wr.inline = rng.randbytes(n)
    else:
        wr.laddr = rng.randrange(SRC_AREA[0], SRC_AREA[1] - n)
    wr.length = n if wr.inline is None else 0
    if not op.is_send and rng.random() < 0.01:
        wr.rkey = BAD_RKEY          # the remote NAKs it: REM_ACCESS_ERR
    return wr


# --------------------------------------------------------------------------------------------
# 3. Directed reproducers of the KNOWN divergences
# --------------------------------------------------------------------------------------------

_wr_ids = iter(range(0x5C00_0001, 1 << 32))


def _wr(op, n, *, rkey=GOOD_RKEY, laddr=None, raddr=0x1000):
    return WorkRequest(qp=0, wr_id=next(_wr_ids), opcode=op, length=n, rkey=rkey, raddr=raddr,
                       laddr=laddr if laddr is not None else SRC_AREA[0])


async def _responder_d1(dut):
    """D1 (fixed): ack_coalesce 4. SEND_ONLY p (count 1); the same again with AckReq, a
    duplicate: re-ACKed, and per the contract the count restarts; WRITE_ONLY p+1..p+4 without
    AckReq: the contract ACKs at p+4 (count 4); the core used to ACK at p+3 (its count went on
    from 1)."""
    b = Bench(dut, pause=0.0)
    await b.start()
    r = ResponderRun(b, pmtu=PathMtu.MTU_256, ack_coalesce=4, min_rnr=1, epsn=0x10, msn=0,
                     known=known_cases())
    await r.setup()
    await r.post_receives([1024])
    send = Packet(Opcode.SEND_ONLY, 0x10, payload=bytes(64))
    await r.feed(send)
    await r.feed(Packet(Opcode.SEND_ONLY, 0x10, ackreq=True, payload=bytes(64)), "duplicate")
    for i in range(4):
        await r.feed(Packet(Opcode.WRITE_ONLY, 0x11 + i, payload=bytes(32),
                            reth=Reth(0x20000 + 64 * i, (MR_INDEX << 8) | MR_TAG, 32)))
    await r.finish()


async def _responder_d10(dut):
    """D10: a page-list region of two 4 KiB pages (bus 0xD0000 and 0xE0000, not adjacent); a
    WRITE_ONLY of 64 bytes across the page boundary, then a READ of the same bytes. The contract
    accepts both (the region holds the range); the core NAKs them with a remote access error."""
    b = Bench(dut, pause=0.0)
    await b.start()
    va = 0x2_0000_0000
    pages = [0xD0000, 0xE0000]
    key = await b.nic.tables.write_mr(6, tag=0x77, tenant=0, pd=0,
                                      access=Access.REMOTE_WRITE | Access.REMOTE_READ, va=va,
                                      length=0x2000, pages=pages, page_shift=12, pbl_index=8)
    b.mr.entries[6] = dict(tag=0x77, tenant=0, pd=0, access=int(Access.REMOTE_WRITE
                           | Access.REMOTE_READ), va=va, length=0x2000, pages=pages,
                           page_shift=12)
    r = ResponderRun(b, pmtu=PathMtu.MTU_256, ack_coalesce=1, min_rnr=1, epsn=0x10, msn=0,
                     known=known_cases())
    await r.setup()
    await r.feed(Packet(Opcode.WRITE_ONLY, 0x10, ackreq=True, payload=bytes(range(64)),
                        reth=Reth(va + 0xFE0, key, 64)))
    await r.feed(Packet(Opcode.READ_REQUEST, 0x11, reth=Reth(va + 0xFE0, key, 64)))
    await r.finish()


async def _responder_d8(dut):
    """D8: ack_coalesce 0. The contract (and the model) ACK every accepted packet ("++ack_count
    >= 0"); the core's CSR reads 0 as "only on AckReq" and sends nothing for a WRITE_ONLY
    without AckReq."""
    b = Bench(dut, pause=0.0)
    await b.start()
    r = ResponderRun(b, pmtu=PathMtu.MTU_256, ack_coalesce=0, min_rnr=1, epsn=0x10, msn=0,
                     known=known_cases())
    await r.setup()
    await r.feed(Packet(Opcode.WRITE_ONLY, 0x10, payload=bytes(32),
                        reth=Reth(0x20000, (MR_INDEX << 8) | MR_TAG, 32)))
    await r.finish()


def _requester_script(name, b):
    mtu = mtu_of(b.pmtu)
    rd = RDST_AREA[0]
    R, W = WrOpcode.RDMA_READ, WrOpcode.RDMA_WRITE
    if name == "lost_read_once":
        # READ (2 packets) and two WRITEs; the READ's first response is lost; the ACK of the
        # first WRITE rewinds both (READ re-requested, WRITEs resent); the ACK of the second
        # WRITE, still in flight: the contract rewinds again, the core does not.
        return [("post", _wr(R, 2 * mtu, laddr=rd)), ("post", _wr(W, 32)), ("post", _wr(W, 32)),
                "remote", "remote", "remote", "local_lose", "local", "local", "local", "settle"]
    if name == "lost_read_retry":
        # retry_cnt 1. READ (1 packet) and a WRITE; the READ response is lost; the WRITE's ACK
        # rewinds (the core spends its one retry); both resends are lost; at the ACK timeout
        # the contract rewinds again (retry_left 1), the core fails with RETRY_EXC_ERR.
        return [("post", _wr(R, 32, laddr=rd)), ("post", _wr(W, 32)), "remote", "remote",
                "local_lose", "local", "remote_lose", "remote_lose", "timer", "settle"]
    if name == "fatal_nak_past_read":
        # READ (1 packet), then a WRITE with a bad rkey; the READ response is lost, the NAK
        # (remote access) of the WRITE arrives: the contract fails the QP now, the core
        # rewinds and re-requests the READ.
        return [("post", _wr(R, 32, laddr=rd)), ("post", _wr(W, 32, rkey=BAD_RKEY)), "remote",
                "remote", "local_lose", "local", "settle"]
    if name == "read_position":
        # READ of 4 packets and a WRITE; FIRST, MIDDLE, MIDDLE arrive, the LAST is overtaken by
        # the WRITE's ACK, which re-requests the last packet's bytes; then the original LAST
        # arrives: the core takes it (LAST at the READ's last bytes: the READ completes), the
        # model wants the re-request's READ_RESP_ONLY and drops it. Both resends are lost: at
        # the ACK timeout the core resends the WRITE, the model the READ request.
        return [("post", _wr(R, 4 * mtu - 123, laddr=rd)), ("post", _wr(W, 32)), "remote",
                "remote", "local", "local", "local", "local_hold", "local", "release", "local",
                "remote_lose", "remote_lose", "timer", "settle"]
    if name == "reserved_syndrome":
        # D5 (fixed): two WRITEs; the first one's ACK is lost; the second one's comes with a
        # reserved syndrome (0x40): the model ignores the packet; the core used to take it as
        # acknowledging PSN - 1 (the first WRITE completed).
        return [("post", _wr(W, 32)), ("post", _wr(W, 32)), "remote", "remote", "local_lose",
                ("mutate", 0x40), "local", "settle"]
    if name == "rnr_progress":
        # D9 (fixed): a SEND finds no receive: RNR NAK, held up in the network; the ACK timer
        # resends the SEND, which now finds a receive and is ACKed. The stale RNR NAK arrives
        # first (RNR wait), then the ACK (progress, nothing outstanding). The model keeps the
        # RNR delay running and sends the next work request when it ends; the core used to
        # disarm its timer -- the RNR delay's -- and stay in the RNR wait for good. (The
        # contract says "disarm if nothing outstanding" and is silent on the RNR wait.)
        return [("post", _wr(WrOpcode.SEND, 32)), "remote", "local_hold", "timer", "remote_recv",
                "remote", "release", "local", "local", ("post", _wr(W, 32)), "timer", "settle"]
    raise ValueError(name)


@cocotb.test()
async def scenario(dut):
    """A directed reproducer of one KNOWN divergence (``STELLAR_TB_SCENARIO``), run with that
    case allowed: it fails where the core and the contract/model part. Those in FIXED pass."""
    name = tb_param("scenario", str)
    if name == "dup_ack_count":
        await _responder_d1(dut)
        return
    if name == "ack_coalesce_zero":
        await _responder_d8(dut)
        return
    if name == "page_list_span":
        await _responder_d10(dut)
        return
    b = await requester_bench(dut, window=16, shift=3)
    known = known_cases()
    if name in known:
        known[name] = True                      # the case is what the scenario is about
    r = await requester_run(b, retry_cnt=1 if name == "lost_read_retry" else 7, rnr_retry=7,
                            sq_psn=0x100, known=known)
    r.clean = True
    r.remote.ack_coalesce = 1
    r.remote.min_rnr_timer = 14         # 1.28 ms: longer than a response takes to go in
    await r.script(_requester_script(name, b))
    check_read_data(b)
