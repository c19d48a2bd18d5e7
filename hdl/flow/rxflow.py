# Ref: IBTA Vol 1 Annex A17 (RoCEv2); IBTA Vol 1 9.7.4 (R_Key checks), 10.6 (memory regions)
"""The receive flow pipeline: parser -> ICRC -> VLAN tenant -> flow table -> MR check -> QP context.

Every received frame is parsed (the packet engine: headers, ICRC, IPv4 checksum), then every
RoCEv2 packet that survived it finds its tenant (VLAN map), its QP (flow table, key (tenant,
destination QP)), and, when it names remote memory (RETH of RDMA WRITE First/Only and READ
requests, AtomicETH of atomics), has that access checked against the memory-region table with
the QP's own tenant and protection domain. Finally the QP context is read; the packet leaves
annotated with its QP index, its context and the MR answer (bus address) for the transport::

            +-> payload -> rxbuf (drops parser verdicts) ----------------------> gate -> o
    i -> Parser                                                                    ^ pass/discard
            +-> record -> recq -------------------------------------------+       |
            +-> key descriptor -> keyq -> VLAN -> flow -> QP attr -> MR -> verdict -> annq
                                                                                  |
                                          QpContextStore.req <- annq <-----------+
                                          QpContextStore.resp + recq head -> o_meta (pass)
                                                                          -> dropped (drop)

Design notes
------------
* The lookups are a fixed-latency pipeline (VLAN 1, flow table ``FlowTable.LATENCY``, QP
  attribute RAM 1, MR check ``MrProtection.LATENCY``, verdict 1) that never stalls; admission
  from ``keyq`` is credit-based (a packet enters only if ``annq`` is sure to have room when it
  leaves), so back-pressure from the consumer never drops or corrupts a lookup.
* The verdict comes long after the frame's payload has been committed to ``rxbuf`` (the parser's
  own verdict comes with the last beat), so a frame dropped here is discarded on the way out:
  the gate reads its beats and throws them away, in order, at one beat per clock.
* The MR check needs the QP's tenant and protection domain before the QP context is read (the
  context read is the last stage, so that the transport consumes it directly from the store and
  the store's hazard forwarding stays intact). They are kept in a small QP attribute RAM written
  from the host's context writes (the fields are set when a QP is created and never change
  while packets for it are accepted). A QP whose tenant is not the packet's (a host programming
  error: a flow entry pointing at another tenant's QP) drops the packet as a tenant violation.
* Drop order (first wins): unmapped VLAN (``flow.rx_drop_tenant``), unknown (tenant, QPN)
  (``flow.rx_drop_unknown_qp``), QP of another tenant (``flow.rx_drop_tenant``), MR check: bad
  or stale key and wrong tenant/PD (``mr.rx_drop_rkey``), access not granted
  (``mr.rx_drop_access``), out of bounds (``mr.rx_drop_bounds``). A dropped packet reads no
  context, is never seen by the transport and cannot cause a DMA.
* Non-RoCE frames skip the lookups and leave unchanged (``ann.roce`` = 0).
* Both outputs leave from registers (timing in the core): the payload through the receive
  buffer's output register; ``o_meta`` (the record from a register behind ``recq``, ``ann``
  and ``ctx`` from the QP context store's queue registers) through a one-entry output register
  (one clock; a packet every other clock at most) whose context follows ``wb`` like the
  store's own copies. ``wb`` reaches the store a clock later, and a host operation on the store
  waits while a packet is in that register.

Ports
-----
i            In   stream of beats from the wire (``beat_layout(data_width)``)
o_meta       Out  stream of ``rx_meta_layout``: ``rec`` (header record), ``ann`` (``ann_layout``),
                  ``ctx`` (QP context, current: see ``QpContextStore``); one per passed frame
o            Out  payload beats of passed frames, in the order of ``o_meta``
dropped      Out  stream of ``rx_meta_layout`` (``ctx`` undefined): one per frame dropped here, in
                  order with ``o_meta`` (a consumer that only counts can tie ``ready`` high)
wb           In   QP-context write-back of the consumer (``QpContextStore.wb``)
tx_frame     In   one pulse per transmitted frame (counted in ``pktengine.tx_frames``)
pktengine, flow, qpctx, mr
             Out  the CSR ports of those register-map blocks (``csr.block_signature``)

Parameters: ``data_width`` (64 or 512), ``qps`` (flow-table capacity = QP context entries),
``mr_entries``, ``mr_pages``, ``rx_buffer_bytes``, ``records`` (queue depth for the frames that
can wait, at least 4: ``records`` - 2 of them at least),
``record_fields`` (the header-record fields ``o_meta``/``dropped`` carry and ``recq`` stores;
None: all of them. NicCore passes ``CORE_RECORD_FIELDS``).
"""

import enum as py_enum

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..csr import block_signature
from ..net import headers as H
from ..net.layout import beat_layout, record_layout
from ..net.parser import Parser, count_rx
from ..pktfifo import PacketFifo
from ..regmap import REGMAP, flow_config, mr_config, pktengine_config, qpctx_config
from .cuckoo import FlowTable
from .fields import KEY_TAG_BITS, MR_ENTRY, PD_BITS, QP_CONTEXT, TENANT_BITS, Access, MrReason
from .layouts import qp_context_layout, struct_layout
from .mr import MrOp, MrProtection
from .qpctx import QpContextStore, QpHostOp
from .vlan import VLAN_ENTRY, VlanTenantMap

__all__ = ["CORE_RECORD_FIELDS", "PIPELINE_RECORD_FIELDS", "FlowVerdict", "ann_layout",
           "parser_record_fields", "rx_meta_layout", "rx_record_layout", "RxFlowPipeline",
           "mr_request_kind"]


class FlowVerdict(enum.IntEnum, shape=3):
    """Why the flow pipeline drops a packet (``ann.reason``)."""
    NONE = 0
    TENANT = 1        # VLAN not mapped, or the QP belongs to another tenant
    UNKNOWN_QP = 2    # (tenant, QPN) not in the flow table
    RKEY = 3          # MR check: bad/stale key, other tenant or PD
    ACCESS = 4        # MR check: access not granted
    BOUNDS = 5        # MR check: outside the region


class MrKind(py_enum.IntEnum):
    """Which remote access a packet asks for (pure Python: shared with the tests)."""
    NONE = 0
    WRITE = 1     # RETH of RDMA WRITE First / Only (/ with immediate)
    READ = 2      # RETH of RDMA READ request
    ATOMIC = 3    # AtomicETH (8 bytes)


def mr_request_kind(opcode):
    """``MrKind`` of a BTH opcode: which packets the pipeline checks against the MR table."""
    op = H.OPCODES.get(opcode)
    if op is None:
        return MrKind.NONE
    if H.ATOMICETH in op.ext:
        return MrKind.ATOMIC
    if H.RETH in op.ext:
        return MrKind.READ if op.name.endswith("RDMA_READ_REQUEST") else MrKind.WRITE
    return MrKind.NONE


_KIND_ACCESS = {MrKind.WRITE: Access.REMOTE_WRITE, MrKind.READ: Access.REMOTE_READ,
                MrKind.ATOMIC: Access.REMOTE_ATOMIC}


def ann_layout(index_bits):
    """What the pipeline learned about a frame."""
    return data.StructLayout({
        "roce": 1,          # a RoCEv2 packet (else the other fields are 0)
        "drop": 1,          # dropped here (only on ``dropped``)
        "reason": FlowVerdict,
        "tenant": TENANT_BITS,
        "qp": index_bits,   # QP index (valid when found)
        "mr_kind": 2,       # MrKind: which access was checked (0: none)
        "mr_reason": 3,     # MrReason of the check
        "bus_addr": 64,     # MR check: bus address of the first byte (0 unless allowed)
        "span": 32,         # MR check: bytes contiguous from there
    })


# The header-record fields the NIC core reads from ``o_meta`` (RcTransport, CongestionControl):
# NicCore queues only these (156 bits) instead of the whole record (1,843: every field of every
# header, IPv4 options, atomic and CNP fields). Yosys already drops memory bits nobody reads, so
# synthesis gains less than the widths suggest (ECPIX-5 board top: EBR 208 -> 202, LUT4 51,452
# -> 50,818, FF 47,582 -> 47,211); the Verilog and the simulation models carry 156 bits, not
# 1,843. A consumer that reads another field fails at elaboration (the View has no such field),
# so the list cannot silently fall behind the code.
CORE_RECORD_FIELDS = ("bth_opcode", "bth_psn", "bth_ackreq", "aeth_syndrome", "reth_dma_length",
                      "ieth_rkey", "immdt_data", "payload_len", "ipv6", "ipv4_ecn", "ipv6_ecn")

# The QP-context fields the NIC core's transport writes back (RcTransport: the responder's
# expected PSN and MSN). NicCore's store keeps only these of a write-back and forwards only
# these between packets; the other 427 bits are written by host operations alone
# (``QpContextStore(wb_fields=...)``). RcTransport asserts at elaboration that it writes these.
CORE_WB_FIELDS = ("epsn", "msn")


# The header-record fields the pipeline itself reads from the parser (the lookup key, the
# packet-engine counters, the verdict): with ``record_fields`` the parser carries only these and
# ``record_fields`` (``parser_record_fields``), so a core build elaborates no header field that
# nothing reads.
PIPELINE_RECORD_FIELDS = ("roce", "vlan", "vlan_vid", "bth_opcode", "bth_dest_qp", "reth_va",
                          "reth_rkey", "reth_dma_length", "atomiceth_va", "atomiceth_rkey", "ipv6",
                          "ipv4_ecn", "ipv6_ecn", "drop", "reason")


def parser_record_fields(record_fields=None):
    """The ``record_fields`` of the pipeline's Parser: None (the whole record) for None, else
    ``record_fields`` and ``PIPELINE_RECORD_FIELDS``."""
    if record_fields is None:
        return None
    return tuple(dict.fromkeys(tuple(record_fields) + PIPELINE_RECORD_FIELDS))


def rx_record_layout(fields=None):
    """The header record as the pipeline queues and hands it on: all of ``record_layout()``
    (``fields`` None), or only the named fields of it, in the given order."""
    full = record_layout()
    if fields is None:
        return full
    return data.StructLayout({name: full[name].shape for name in fields})


def rx_meta_layout(index_bits, record_fields=None):
    return data.StructLayout({
        "rec": rx_record_layout(record_fields),
        "ann": ann_layout(index_bits),
        "ctx": qp_context_layout(),
    })


def _key_layout():
    """What the lookups need from the header record (queued with each accepted frame)."""
    return data.StructLayout({
        "roce": 1,
        "tagged": 1,
        "vid": 12,
        "qpn": 24,
        "kind": 2,
        "rkey": 32,
        "va": 64,
        "length": 32,
    })


def _delay(m, value, cycles, name):
    """``value`` delayed by ``cycles`` clocks (a shift register)."""
    prev = value
    for i in range(cycles):
        reg = Signal.like(value, name=f"{name}_d{i + 1}")
        m.d.sync += reg.eq(prev)
        prev = reg
    return prev


class RxFlowPipeline(wiring.Component):
    def __init__(self, data_width=64, *, qps=4096, mr_entries=1024, mr_pages=1024,
                 rx_buffer_bytes=32768, records=256, pass_mr_failures=False, record_fields=None,
                 wb_fields=None):
        self.pass_mr_failures = pass_mr_failures
        self.record_fields = record_fields
        self.wb_fields = wb_fields
        self.data_width = data_width
        self.qps = qps
        self.mr_entries = mr_entries
        self.mr_pages = mr_pages
        self.rx_buffer_bytes = rx_buffer_bytes
        assert records >= 4, "records: at least 4 (at least records - 2 frames can wait)"
        self.records = records
        self.index_bits = max(1, (qps - 1).bit_length())
        beat = beat_layout(data_width)
        self._store_sig = QpContextStore(qps, user_width=ann_layout(self.index_bits).size,
                                         wb_fields=wb_fields)
        super().__init__({
            "i":         In(stream.Signature(beat)),
            "o_meta":    Out(stream.Signature(rx_meta_layout(self.index_bits, record_fields))),
            "o":         Out(stream.Signature(beat)),
            "dropped":   Out(stream.Signature(rx_meta_layout(self.index_bits, record_fields))),
            "wb":        In(self._store_sig.wb.signature.flip()),
            "tx_frame":  In(1),
            "ctx_written": Out(stream.Signature(data.StructLayout({
                "index": self.index_bits, "mask": len(QP_CONTEXT.fields),
                "ctx": qp_context_layout()}), always_ready=True)),
            "set_state": In(stream.Signature(data.StructLayout({
                "index": self.index_bits, "state": 3}))),
            "mr_invalidate": In(stream.Signature(data.StructLayout({
                "key": 32, "tenant": TENANT_BITS, "pd": PD_BITS}))),
            "pktengine": Out(block_signature(REGMAP.block("pktengine"))),
            "flow":      Out(block_signature(REGMAP.block("flow"))),
            "qpctx":     Out(block_signature(REGMAP.block("qpctx"))),
            "mr":        Out(block_signature(REGMAP.block("mr"))),
        })

    @property
    def lookup_latency(self):
        """Clocks from a key leaving ``keyq`` to its verdict entering ``annq``."""
        return VlanTenantMap.LATENCY + FlowTable.LATENCY + 1 + self._mr_latency + 1

    @property
    def _mr_latency(self):
        return MrProtection.LATENCY

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        IB = self.index_bits
        ann_l = ann_layout(IB)
        key_l = _key_layout()

        m.submodules.parser = parser = Parser(W, record_fields=parser_record_fields(
            self.record_fields))
        # out_reg: the payload leaves from a register, not from the block RAM's slow output
        m.submodules.rxbuf = rxbuf = PacketFifo(beat_layout(W), self.rx_buffer_bytes // (W // 8),
                                                out_reg=True, reg_flags=True)
        rec_l = rx_record_layout(self.record_fields)
        m.submodules.recq = recq = SyncFIFOBuffered(width=rec_l.size, depth=self.records)
        m.submodules.keyq = keyq = SyncFIFOBuffered(width=key_l.size, depth=self.records)
        m.submodules.vlan = vlan = VlanTenantMap()
        m.submodules.flow = flow = FlowTable(self.qps)
        m.submodules.mr = mr = MrProtection(self.mr_entries, self.mr_pages)
        m.submodules.store = store = self._store_sig
        m.submodules.attr = attr_mem = Memory(
            shape=data.StructLayout({"tenant": TENANT_BITS, "pd": PD_BITS}), depth=self.qps, init=[])
        attr_rd = attr_mem.read_port()
        attr_wr = attr_mem.write_port()

        # ------------------------------------------------------------ parser -> rxbuf, queues
        m.d.comb += [parser.i.valid.eq(self.i.valid), parser.i.payload.eq(self.i.payload),
                     self.i.ready.eq(parser.i.ready)]
        meta = parser.o_meta
        # ``room`` from a flip-flop, a clock ahead and one or two entries short: a queue below
        # ``records`` - 2 entries (its level counts the output register) still has room in
        # the next clock whatever is written meanwhile (one entry a clock at most). As the
        # queues' ``w_rdy`` it was a compare of their fill counts chained into the parser's
        # output handshake (651 failing endpoints of the routed ECPIX-5 core, 2026-12-07,
        # across the die from the queues to the parser's output stage enables).
        # Three copies of it, one for each consumer: the parser's output handshake, rxbuf's
        # input and the queues' write enables (``keep``). One flip-flop spread over 45 tiles
        # (2.6 ns of wire) at the start of -1.44 ns paths into rxbuf's fill logic, routed on the
        # ECPIX-5 core at c45f3e0. The copies must stay three flip-flops: Yosys merges
        # flip-flops with the same input, reset and initial value, so they differ in those
        # alone -- ``room_o`` resets to 1, ``room_b`` to 0, ``room_k`` has no reset (initial
        # value 1). They can then differ only in the clock after a reset, when the parser's
        # output is empty (its valid is reset) and every use of them is gated by that valid.
        room_o = Signal(init=1)
        room_b = Signal(init=0)
        room_k = Signal(init=1, reset_less=True)
        room_d = Signal()
        m.d.comb += room_d.eq((recq.level < self.records - 2) & (keyq.level < self.records - 2))
        m.d.sync += [room_o.eq(room_d), room_b.eq(room_d), room_k.eq(room_d)]
        last = Signal()
        m.d.comb += [
            # A frame's record and key are queued with its last beat, so a beat moves only when
            # all three queues have room (valid and ready both gated: no duplicated beats).
            rxbuf.i.valid.eq(parser.o.valid & room_b),
            rxbuf.i.payload.eq(parser.o.payload),
            rxbuf.i_drop.eq(meta.drop),
            parser.o.ready.eq(rxbuf.i.ready & room_o),
            last.eq(parser.o.valid & rxbuf.i.ready & room_k & parser.o.payload.last),
        ]
        keep = Signal()
        m.d.comb += keep.eq(last & ~meta.drop & ~rxbuf.i_overflow)

        kind = Signal(2)
        with m.Switch(meta.bth_opcode):
            for code in H.OPCODES:
                k = mr_request_kind(code)
                if k != MrKind.NONE:
                    with m.Case(code):
                        m.d.comb += kind.eq(k)
        key_in = Signal(key_l)
        is_atomic = Signal()
        m.d.comb += [
            is_atomic.eq(kind == MrKind.ATOMIC),
            key_in.roce.eq(meta.roce),
            key_in.tagged.eq(meta.vlan),
            key_in.vid.eq(meta.vlan_vid),
            key_in.qpn.eq(meta.bth_dest_qp),
            key_in.kind.eq(Mux(meta.roce, kind, 0)),
            key_in.rkey.eq(Mux(is_atomic, meta.atomiceth_rkey, meta.reth_rkey)),
            key_in.va.eq(Mux(is_atomic, meta.atomiceth_va, meta.reth_va)),
            key_in.length.eq(Mux(is_atomic, 8, meta.reth_dma_length)),
            recq.w_en.eq(keep),
            recq.w_data.eq(meta if self.record_fields is None
                           else Cat(meta[name] for name in self.record_fields)),
            keyq.w_en.eq(keep),
            keyq.w_data.eq(key_in),
        ]

        # ------------------------------------------------------------ lookup pipeline
        # Credits: packets admitted and not yet taken out of annq. annq is as deep as the
        # pipeline is long plus slack, so an admitted packet always finds room.
        L = self.lookup_latency
        annq_depth = 1 << (L + 4).bit_length()
        m.submodules.annq = annq = SyncFIFOBuffered(width=ann_l.size, depth=annq_depth)
        outstanding = Signal(range(annq_depth + 1))
        admit = Signal()
        m.d.comb += [
            admit.eq(keyq.r_rdy & (outstanding < annq_depth)),
            keyq.r_en.eq(admit),
        ]
        annq_pop = Signal()
        m.d.sync += outstanding.eq(outstanding + admit - annq_pop)

        k0 = Signal(key_l)
        m.d.comb += k0.eq(keyq.r_data)
        # stage V: VLAN -> tenant
        m.d.comb += [
            vlan.lookup.valid.eq(admit & k0.roce),
            vlan.lookup.payload.tagged.eq(k0.tagged),
            vlan.lookup.payload.vid.eq(k0.vid),
        ]
        v_valid = _delay(m, admit, VlanTenantMap.LATENCY, "v_valid")
        v_key = Signal(key_l)
        m.d.comb += v_key.eq(_delay(m, k0, VlanTenantMap.LATENCY, "v_key"))
        v_mapped = Signal()
        v_tenant = Signal(TENANT_BITS)
        m.d.comb += [v_mapped.eq(vlan.result.payload.mapped), v_tenant.eq(vlan.result.payload.tenant)]

        # stage F: flow table (tenant, QPN) -> QP index
        m.d.comb += [
            flow.lookup.valid.eq(v_valid & v_key.roce & v_mapped),
            flow.lookup.payload.key.tenant.eq(v_tenant),
            flow.lookup.payload.key.qpn.eq(v_key.qpn),
        ]
        FL = FlowTable.LATENCY
        f_valid = _delay(m, v_valid, FL, "f_valid")
        f_key = Signal(key_l)
        m.d.comb += f_key.eq(_delay(m, v_key, FL, "f_key"))
        f_mapped = _delay(m, v_mapped, FL, "f_mapped")
        f_tenant = _delay(m, v_tenant, FL, "f_tenant")
        f_hit = Signal()
        f_qp = Signal(IB)
        m.d.comb += [f_hit.eq(flow.result.valid & flow.result.payload.hit),
                     f_qp.eq(flow.result.payload.value)]

        # stage A: QP attributes (tenant, PD) of the QP found
        m.d.comb += attr_rd.addr.eq(f_qp)
        a_valid = _delay(m, f_valid, 1, "a_valid")
        a_key = Signal(key_l)
        m.d.comb += a_key.eq(_delay(m, f_key, 1, "a_key"))
        a_mapped = _delay(m, f_mapped, 1, "a_mapped")
        a_tenant = _delay(m, f_tenant, 1, "a_tenant")
        a_hit = _delay(m, f_hit, 1, "a_hit")
        a_qp = _delay(m, f_qp, 1, "a_qp")
        a_qp_tenant_ok = Signal()
        m.d.comb += a_qp_tenant_ok.eq(attr_rd.data.tenant == a_tenant)

        # stage M: MR check with the QP's tenant and PD
        access = Signal(4)
        with m.Switch(a_key.kind):
            for k, acc in _KIND_ACCESS.items():
                with m.Case(k):
                    m.d.comb += access.eq(acc)
        check, result = mr.check[0], mr.result[0]
        m.d.comb += [
            check.valid.eq(a_valid & a_key.roce & a_mapped & a_hit & a_qp_tenant_ok & (a_key.kind != 0)),
            check.payload.tenant.eq(attr_rd.data.tenant),
            check.payload.pd.eq(attr_rd.data.pd),
            check.payload.key.eq(a_key.rkey),
            check.payload.va.eq(a_key.va),
            check.payload.length.eq(a_key.length),
            check.payload.access.eq(access),
        ]
        ML = self._mr_latency
        ann_a = Signal(ann_l)
        m.d.comb += [
            ann_a.roce.eq(a_key.roce),
            ann_a.tenant.eq(Mux(a_key.roce, a_tenant, 0)),   # non-RoCE frames were not looked up
            ann_a.qp.eq(Mux(a_hit, a_qp, 0)),
            ann_a.mr_kind.eq(Mux(check.valid, a_key.kind, 0)),
        ]
        with m.If(a_key.roce):
            with m.If(~a_mapped):
                m.d.comb += [ann_a.drop.eq(1), ann_a.reason.eq(FlowVerdict.TENANT)]
            with m.Elif(~a_hit):
                m.d.comb += [ann_a.drop.eq(1), ann_a.reason.eq(FlowVerdict.UNKNOWN_QP)]
            with m.Elif(~a_qp_tenant_ok):
                m.d.comb += [ann_a.drop.eq(1), ann_a.reason.eq(FlowVerdict.TENANT)]
        m_valid = _delay(m, a_valid, ML, "m_valid")
        m_ann = Signal(ann_l)
        m.d.comb += m_ann.eq(_delay(m, ann_a, ML, "m_ann"))

        # stage D: verdict
        d_ann = Signal(ann_l)
        m.d.comb += d_ann.eq(m_ann)
        with m.If(m_ann.mr_kind != 0):
            m.d.comb += [
                d_ann.mr_reason.eq(result.payload.reason),
                d_ann.bus_addr.eq(result.payload.bus_addr),
                d_ann.span.eq(result.payload.span),
            ]
            with m.If(~result.payload.allowed):
                # The transport NAKs them (remote access error) when asked to see them.
                m.d.comb += d_ann.drop.eq(not self.pass_mr_failures)
                with m.Switch(result.payload.reason):
                    with m.Case(MrReason.BAD_KEY, MrReason.PD_TENANT):
                        m.d.comb += d_ann.reason.eq(FlowVerdict.RKEY)
                    with m.Case(MrReason.ACCESS):
                        m.d.comb += d_ann.reason.eq(FlowVerdict.ACCESS)
                    with m.Default():
                        m.d.comb += d_ann.reason.eq(FlowVerdict.BOUNDS)
        v_ann = Signal(ann_l)
        v_ok = Signal()
        m.d.sync += [v_ok.eq(m_valid), v_ann.eq(d_ann)]
        m.d.comb += [annq.w_en.eq(v_ok), annq.w_data.eq(v_ann)]

        fl, mrc = self.flow, self.mr
        m.d.comb += [
            fl.rx_lookups_inc.eq(v_ok & v_ann.roce),
            fl.rx_drop_tenant_inc.eq(v_ok & v_ann.drop & (v_ann.reason == FlowVerdict.TENANT)),
            fl.rx_drop_unknown_qp_inc.eq(v_ok & v_ann.drop & (v_ann.reason == FlowVerdict.UNKNOWN_QP)),
            mrc.rx_mr_checks_inc.eq(v_ok & (v_ann.mr_kind != 0)),
            mrc.rx_drop_rkey_inc.eq(v_ok & (v_ann.reason == FlowVerdict.RKEY)),
            mrc.rx_drop_access_inc.eq(v_ok & (v_ann.reason == FlowVerdict.ACCESS)),
            mrc.rx_drop_bounds_inc.eq(v_ok & (v_ann.reason == FlowVerdict.BOUNDS)),
        ]

        # ------------------------------------------------------------ QP context read
        q_ann = Signal(ann_l)
        m.d.comb += [
            q_ann.eq(annq.r_data),
            store.req.valid.eq(annq.r_rdy),
            store.req.payload.index.eq(q_ann.qp),
            store.req.payload.user.eq(annq.r_data),
            # req_ok: req.ready as it is with req.valid (annq.r_rdy) high, from fewer inputs
            annq.r_en.eq(store.req_ok),
            annq_pop.eq(annq.r_rdy & store.req.ready),
        ]
        # The consumer's write-back reaches the store a clock late, through flip-flops by the
        # store: see the output stage below.
        m.d.sync += [store.wb.valid.eq(self.wb.valid), store.wb.payload.eq(self.wb.payload)]

        # ------------------------------------------------------------ output: pass or drop
        # decq tells the gate, frame by frame, whether rxbuf's next frame goes out or is
        # discarded; it is written when the frame's verdict leaves the store.
        # Its room is registered, a clock ahead (as recq's): ``decq.w_rdy`` gated the store's
        # pop, and so the enables of the store's queue registers (12.4 ns routed on the ECPIX-5
        # core, 2026-12-07). 18 deep, so that 16 verdicts still fit.
        # The queue's head (its output register) is kept here, as three flip-flops that differ
        # in value, so Yosys keeps them apart: ``d_rdy`` (a verdict is at the head) and
        # ``d_pass_b`` (``~d_rdy`` or the head passes) for the receive buffer's read side,
        # ``d_pass_o`` (``d_rdy`` and the head passes) for ``o.valid``. The one output register
        # of a SyncFIFOBuffered fed both, the consumer's side and rxbuf's read enable: a 74-tile
        # net at the start of -2.44 ns paths into rxbuf's read pointer, routed on the ECPIX-5
        # core at c45f3e0. The same queue otherwise (17 entries and the head, the head loaded
        # a clock after the write, as SyncFIFOBuffered's).
        m.submodules.decq = decq = SyncFIFO(width=1, depth=17)
        d_rdy = Signal()
        d_pass_b = Signal(init=1)
        d_pass_o = Signal()
        d_pop = Signal()
        d_load = Signal()
        m.d.comb += [
            decq.r_en.eq(~d_rdy | d_pop),
            d_load.eq(decq.r_rdy & decq.r_en),
        ]
        with m.If(d_load):
            m.d.sync += [d_rdy.eq(1), d_pass_b.eq(decq.r_data[0]), d_pass_o.eq(decq.r_data[0])]
        with m.Elif(d_pop):
            m.d.sync += [d_rdy.eq(0), d_pass_b.eq(1), d_pass_o.eq(0)]
        decq_room = Signal()
        m.d.sync += decq_room.eq(decq.level + d_rdy < 18 - 2)
        r_ann = Signal(ann_l)
        m.d.comb += r_ann.eq(store.resp.payload.user)
        # recq's head goes through a register before it leaves with o_meta, so that the
        # consumer's logic starts at flip-flops, not at the block RAM's slow output (in the core,
        # the transport's decode of the record behind a block RAM's clock-to-out was the deepest
        # path between blocks). ann and ctx already come from the store's queue registers; ctx
        # must stay there, where it snoops the consumer's write-backs (the store's contract).
        rec = Signal(rec_l)
        rec_valid = Signal()
        rec_take = Signal()
        rec_load = Signal()
        m.d.comb += [rec_load.eq(~rec_valid | rec_take), recq.r_en.eq(rec_load)]
        with m.If(rec_load):
            m.d.sync += [rec_valid.eq(recq.r_rdy), rec.eq(recq.r_data)]
        # Passed packets leave through a one-entry output register whose context follows the
        # consumer's write-backs, as the store's own copies do: so the consumer still sees, in
        # the clock after it takes a packet and writes it back, the next packet of that QP with
        # the update. The store's pop and its ~500 load enables then depend on flip-flops of
        # this block only, not on the consumer's take and write-back (from the transport's
        # wb.valid across the die to the store's head it was 11.87 ns, 372 failing endpoints,
        # routed on the ECPIX-5 core at 245eb29). The write-back reaches the store a clock late
        # (registered above): what the store presents lacks that registered write-back and the
        # live one, so both are applied on the way in. A host operation waits at the store's
        # head while a packet ahead of it is here or its write-back is on the way
        # (``host_hold``), so it still follows that write-back. One entry, loaded only while
        # empty: a packet every other clock at most, and ``o_meta`` straight from flip-flops
        # (the transport takes one in several clocks).
        wb_fields = store.wb_fields

        def follow(ctx, index, wb):
            """``ctx`` (a Value) with the write-back ``wb`` applied when it is for ``index``."""
            hit = wb.valid & (wb.payload.index == index)
            new = wb.payload.ctx.as_value()
            parts, pos = [], 0
            for f in sorted(QP_CONTEXT.fields, key=lambda f: QP_CONTEXT.offsets[f.name]):
                off, w = QP_CONTEXT.offsets[f.name], f.width
                assert off == pos
                part = ctx[off:off + w]
                parts.append(Mux(hit, new[off:off + w], part) if f.name in wb_fields else part)
                pos = off + w
            assert pos == QP_CONTEXT.width
            return Cat(*parts)

        o_full = Signal()
        o_ent = Signal(rx_meta_layout(IB, self.record_fields))
        o_load = Signal()
        # The store's host_hold is ``o_full | store.wb.valid``, from a flip-flop of its own
        # (loaded with the next value of both): store.wb.valid, which fans out to every snoop
        # of the store, then does not start the host operation's done decision as well (its
        # 23-tile net began a -2.85 ns path to the store's head, routed on the ECPIX-5 core at
        # c45f3e0).
        hold = Signal()
        m.d.sync += hold.eq(o_load | (o_full & ~self.o_meta.ready) | self.wb.valid)
        m.d.comb += [
            self.o_meta.valid.eq(o_full),
            self.o_meta.payload.eq(o_ent),
            store.host_hold.eq(hold),
        ]
        with m.If(o_load):
            m.d.sync += [
                o_full.eq(1),
                o_ent.rec.eq(rec),
                o_ent.ann.eq(r_ann),
                o_ent.ctx.eq(follow(follow(store.resp.payload.ctx.as_value(),
                                           store.resp.payload.index, store.wb),
                                    store.resp.payload.index, self.wb)),
            ]
        with m.Else():
            m.d.sync += o_ent.ctx.eq(follow(o_ent.ctx.as_value(), o_ent.ann.qp, self.wb))
            with m.If(self.o_meta.ready):
                m.d.sync += o_full.eq(0)
        # A dropped frame too waits while a passed one is in the output register: the two
        # outputs stay in frame order, never both valid in one clock.
        head = Signal()
        m.d.comb += head.eq(store.resp.valid & rec_valid & decq_room & ~o_full)
        take = Signal()
        with m.If(r_ann.drop):
            m.d.comb += take.eq(head & self.dropped.ready)
        with m.Else():
            m.d.comb += take.eq(head)
        m.d.comb += [
            o_load.eq(head & ~r_ann.drop),
            store.resp.ready.eq(take),
            rec_take.eq(take),
            decq.w_en.eq(take),
            decq.w_data.eq(~r_ann.drop),
            self.dropped.valid.eq(head & r_ann.drop),
            self.dropped.payload.rec.eq(rec),
            self.dropped.payload.ann.eq(r_ann),
        ]
        m.d.comb += [
            # a passed frame's beats go out; a dropped frame's are read and thrown away
            self.o.valid.eq(rxbuf.o.valid & d_pass_o),
            rxbuf.o.ready.eq(d_rdy & (~d_pass_b | self.o.ready)),
            self.o.payload.eq(rxbuf.o.payload),
            d_pop.eq(rxbuf.o.valid & rxbuf.o.ready & rxbuf.o.payload.last),
        ]

        # ------------------------------------------------------------ packet-engine counters
        count_rx(m, self.pktengine, meta, last, rxbuf.i_overflow)
        m.d.comb += [
            self.pktengine.config.eq(pktengine_config(W)),
            self.pktengine.tx_frames_inc.eq(self.tx_frame),
        ]

        # ------------------------------------------------------------ host management
        self._flow_csr(m, flow)
        self._vlan_csr(m, vlan)
        self._qpctx_csr(m, store, attr_wr)
        self._mr_csr(m, mr)
        return m

    # Each management path: the CSR command pulse is held as a pending request until the
    # block takes it; a command written while one is pending or running (or an unknown one) is
    # ignored and flagged (status.error) rather than queued, so the driver's view stays simple.

    @staticmethod
    def _command_slot(m, stb, known, cmd, done):
        """The pending/running/error bookkeeping of one management path. ``stb``: the CSR
        command pulse; ``known``: the command value is one the block has; ``cmd``: the block's
        command stream (its ``valid`` is driven here); ``done``: the block's answer pulse.
        Returns ``(start, busy, error)``: latch the command's operands in the clock of ``start``."""
        known = Value.cast(known)
        pending = Signal()
        running = Signal()
        error = Signal()
        busy = Signal()
        start = Signal()
        m.d.comb += [
            busy.eq(pending | running),
            start.eq(stb & ~busy & known),
            cmd.valid.eq(pending),
        ]
        with m.If(stb):
            m.d.sync += error.eq(busy | ~known)
        with m.If(start):
            m.d.sync += pending.eq(1)
        with m.If(cmd.valid & cmd.ready):
            m.d.sync += [pending.eq(0), running.eq(1)]
        with m.If(done):
            m.d.sync += running.eq(0)
        return start, busy, error

    @staticmethod
    def _window(c, prefix, words):
        """The CSR data window ``<prefix>0 .. <prefix>{words-1}`` as one value, word 0 lowest."""
        return Cat(*(getattr(c, f"{prefix}{i}") for i in range(words)))

    def _flow_csr(self, m, flow):
        c = self.flow
        start, busy, error = self._command_slot(m, c.command_stb, 1, flow.cmd, flow.resp.valid)
        done = Signal()
        outcome = Signal(2)
        value = Signal(16)
        cycles = Signal(16)
        with m.If(start):
            m.d.sync += [
                done.eq(0),
                flow.cmd.payload.op.eq(c.command),
                flow.cmd.payload.key.tenant.eq(c.key_tenant),
                flow.cmd.payload.key.qpn.eq(c.key_qpn),
                flow.cmd.payload.value.eq(c.value),
            ]
        with m.If(flow.resp.valid):
            m.d.sync += [done.eq(1), outcome.eq(flow.resp.payload.status),
                         value.eq(flow.resp.payload.value), cycles.eq(flow.resp.payload.cycles)]
        m.d.comb += [
            c.config.eq(flow_config(self.qps, flow.ways, flow.stash, FlowTable.LATENCY)),
            c.status.eq(Cat(busy, outcome, error, done)),
            c.result_value.eq(value),
            c.result_cycles.eq(cycles),
            c.occupancy.eq(flow.occupancy),
            c.stash_used.eq(flow.stash_used),
        ]

    def _vlan_csr(self, m, vlan):
        c = self.flow
        entry = Signal(VLAN_ENTRY)
        m.d.comb += [
            entry.eq(c.vlan_tenant),
            vlan.cmd.valid.eq(c.vlan_command_stb & ((c.vlan_command == 1) | (c.vlan_command == 2))),
            vlan.cmd.payload.write.eq(c.vlan_command == 1),
            vlan.cmd.payload.vid.eq(c.vlan_vid),
            vlan.cmd.payload.entry.eq(entry),
        ]
        was_read = Signal()
        result = Signal(VLAN_ENTRY)
        m.d.sync += was_read.eq(vlan.cmd.valid & ~vlan.cmd.payload.write)
        with m.If(was_read):
            m.d.sync += result.eq(vlan.rdata)
        m.d.comb += c.vlan_result.eq(result)

    def _qpctx_csr(self, m, store, attr_wr):
        c = self.qpctx
        words = QP_CONTEXT.words
        known = Signal()
        m.d.comb += known.eq((c.command == 1) | (c.command == 2))
        # The store's host port serves two masters: the CSR command slot, and the transport's
        # state changes (a QP moved to ERROR), as a masked write of the state field. The CSR
        # slot has priority; the owner of the operation in flight routes its answer.
        hp = store.host.payload.shape()
        slot = stream.Signature(data.StructLayout({
            "op": hp["op"].shape, "index": hp["index"].shape, "mask": hp["mask"].shape})).create()
        csr_op = Signal()           # the operation in flight is the CSR's
        done = Signal()
        m.d.comb += done.eq(store.host_resp.valid & csr_op)
        start, busy, error = self._command_slot(m, c.command_stb, known, slot, done)
        host = slot.payload
        ss = self.set_state
        # The context comes from the CSR window itself, not from a copy taken with the command:
        # the host leaves wdata* alone while status.busy (regmap), and the store takes it the
        # clock it accepts the operation (into its own h_ctx). A copy here was 475 more
        # flip-flops behind one load enable, which the ECPIX-5 routing found among its most
        # overused nets (README, board notes).
        window = self._window(c, "wdata", words)[:QP_CONTEXT.width]
        with m.If(slot.valid):
            m.d.comb += [store.host.valid.eq(1), store.host.payload.op.eq(host.op),
                         store.host.payload.index.eq(host.index),
                         store.host.payload.mask.eq(host.mask), store.host.payload.ctx.eq(window),
                         slot.ready.eq(store.host.ready)]
        with m.Else():
            m.d.comb += [store.host.valid.eq(ss.valid),
                         store.host.payload.op.eq(QpHostOp.WRITE),
                         store.host.payload.index.eq(ss.payload.index),
                         store.host.payload.mask.eq(QP_CONTEXT.mask(["state"])),
                         store.host.payload.ctx.state.eq(ss.payload.state),
                         ss.ready.eq(store.host.ready)]
        with m.If(store.host.valid & store.host.ready):
            m.d.sync += csr_op.eq(slot.valid)
        op_mask = Signal(len(QP_CONTEXT.fields))
        op_write = Signal()
        op_index = Signal(self.index_bits)
        with m.If(store.host.valid & store.host.ready):
            m.d.sync += [op_mask.eq(store.host.payload.mask), op_index.eq(store.host.payload.index),
                         op_write.eq(store.host.payload.op == QpHostOp.WRITE)]
        with m.If(start):
            m.d.sync += [
                host.op.eq(Mux(c.command == 2, QpHostOp.WRITE, QpHostOp.READ)),
                host.index.eq(c.index),
                host.mask.eq(c.mask),
            ]
        rdata = Signal(32 * words)
        written = Signal(qp_context_layout())
        m.d.comb += written.eq(store.host_resp.payload.ctx)
        with m.If(done):
            m.d.sync += rdata.eq(written)
        # The attribute RAM follows the context as written (tenant and PD for the MR check), and
        # so does the transport (ctx_written: its transmit copy and state initialization).
        wrote = Signal()
        m.d.comb += [
            wrote.eq(store.host_resp.valid & op_write),
            attr_wr.en.eq(wrote),
            attr_wr.addr.eq(op_index),
            attr_wr.data.tenant.eq(written.tenant),
            attr_wr.data.pd.eq(written.pd),
            self.ctx_written.valid.eq(wrote),
            self.ctx_written.payload.index.eq(op_index),
            self.ctx_written.payload.mask.eq(op_mask),
            self.ctx_written.payload.ctx.eq(written),
        ]
        m.d.comb += [
            c.config.eq(qpctx_config(self.qps)),
            c.status.eq(Cat(busy, error)),
            *(getattr(c, f"rdata{i}").eq(rdata[32 * i:32 * i + 32]) for i in range(words)),
        ]

    def _mr_csr(self, m, mr):
        c = self.mr
        words = MR_ENTRY.words
        # The MR table's command port serves the CSR command slot and the transport's
        # invalidations (SEND with Invalidate, IBTA 9.4.1.1.3 / 10.6.7): a read-check-write of
        # the entry the rkey names, done only if the key's tag, tenant and PD match (a stale or
        # foreign key invalidates nothing). An invalidation, once started, finishes before the
        # CSR slot gets the port again.
        cp = mr.cmd.payload.shape()
        slot = stream.Signature(data.StructLayout({
            "op": cp["op"].shape, "index": cp["index"].shape})).create()
        csr_op = Signal()
        done = Signal()
        m.d.comb += done.eq(mr.resp.valid & csr_op)
        start, busy, error = self._command_slot(m, c.command_stb, 1, slot, done)
        with m.If(start):
            m.d.sync += [
                slot.payload.op.eq(c.command),
                slot.payload.index.eq(c.index),
            ]
        # The entry comes from the CSR window itself (the host leaves wdata* alone while
        # status.busy; the table writes it the clock it takes the command), as in _qpctx_csr.
        window = self._window(c, "wdata", words)[:MR_ENTRY.width]
        inv = self.mr_invalidate
        entry = Signal(struct_layout(MR_ENTRY))
        m.d.comb += entry.eq(mr.resp.payload.data)
        kept = Signal(struct_layout(MR_ENTRY))
        with m.FSM(name="mr_inv"):
            with m.State("IDLE"):
                with m.If(slot.valid):
                    m.d.comb += [mr.cmd.valid.eq(1), mr.cmd.payload.op.eq(slot.payload.op),
                                 mr.cmd.payload.index.eq(slot.payload.index),
                                 mr.cmd.payload.data.eq(window), slot.ready.eq(mr.cmd.ready)]
                    with m.If(mr.cmd.ready):
                        m.d.sync += csr_op.eq(1)
                with m.Elif(inv.valid & ~busy):
                    m.d.comb += [mr.cmd.valid.eq(1), mr.cmd.payload.op.eq(MrOp.READ_ENTRY),
                                 mr.cmd.payload.index.eq(inv.payload.key[KEY_TAG_BITS:])]
                    with m.If(mr.cmd.ready):
                        m.d.sync += csr_op.eq(0)
                        m.next = "READ"
            # The entry read is registered (``kept``) and matched in CHECK, a clock later: from
            # the MR table's answer through the match into this machine and the invalidation
            # register's ready it was -2.79 ns routed on the ECPIX-5 core at a30d177.
            with m.State("READ"):
                with m.If(mr.resp.valid):
                    m.d.sync += kept.eq(entry)
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(kept.valid & (kept.tag == inv.payload.key[:KEY_TAG_BITS])
                          & (kept.tenant == inv.payload.tenant) & (kept.pd == inv.payload.pd)):
                    m.next = "WRITE"
                with m.Else():
                    m.d.comb += inv.ready.eq(1)
                    m.next = "IDLE"
            with m.State("WRITE"):
                cleared = Signal(struct_layout(MR_ENTRY))
                m.d.comb += [cleared.eq(kept), cleared.valid.eq(0)]
                m.d.comb += [mr.cmd.valid.eq(1), mr.cmd.payload.op.eq(MrOp.WRITE_ENTRY),
                             mr.cmd.payload.index.eq(inv.payload.key[KEY_TAG_BITS:]),
                             mr.cmd.payload.data.eq(cleared)]
                with m.If(mr.cmd.ready):
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(mr.resp.valid):
                    m.d.comb += [inv.ready.eq(1), self.mr.rx_invalidations_inc.eq(1)]
                    m.next = "IDLE"
        rdata = Signal(32 * words)
        with m.If(done):
            m.d.sync += rdata.eq(mr.resp.payload.data)
        m.d.comb += [
            c.config.eq(mr_config(self.mr_entries, self.mr_pages)),
            c.status.eq(Cat(busy, error)),
            *(getattr(c, f"rdata{i}").eq(rdata[32 * i:32 * i + 32]) for i in range(words)),
        ]
