# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.4; IBTA Vol 1 ch. 9.2-9.3 (BTH, RETH, AETH, ImmDt, IETH)
"""TX packet builder: turns packet descriptors into header records and payload beats for the
deparser.

The transport decides *what* to send (``tx_desc_layout``: opcode, PSN, extension-header values,
where the payload comes from); the builder knows *how* a packet of a QP looks on the wire. It
reads the QP's transmit attributes (the copy of its context the transport keeps: destination
MAC/IP, remote QPN, P_Key, traffic class, hop limit, flow label, UDP source port, VLAN and
priority) and the local address from the GID table, fills the deparser's header record, and
sources the payload: read from host memory by DMA, taken from the descriptor (inline data of
small messages), or a single empty beat for header-only packets::

    desc -> [S0: ctx read] -> [S1: record] -+-> recq ------------------> o_meta (deparser.i_meta)
                                            +-> dma_cmd (DMA payload)
                                            +-> srcq -> payload mux ---> o (deparser.i)
                                                           ^ dma_data

The deparser computes lengths, pad, checksums and the ICRC. One descriptor per clock at 512 bits
(one every third clock when frames span two beats or more, 64 bits: the context is registered
before the record is built); the payload mux moves from one packet's last beat to the next
packet's first beat without a bubble, so back-to-back packets leave at line rate as long as the
DMA keeps up.

Ports
-----
desc        In   stream of ``tx_desc_layout(index_bits)``
ctx_addr    Out  QP index to read the transmit context of (a synchronous read port of the owner's
                 context copy: ``ctx_data`` is valid the clock after ``ctx_en``)
ctx_en      Out  read enable
ctx_data    In   the QP context (``qp_context_layout``)
gid         In   array of ``GIDS`` x ``gid_layout`` (source MAC, IP, IPv6 flag)
tc_mark     In   array of ``CLASSES`` x ``marking_layout``: per traffic class (the QP's ``sl``), DSCP
                 and PCP that replace the QP's own when ``en`` is set (ECN bits stay the QP's)
cnp_mark    In   ``marking_layout`` of CNPs (opcode 0x81: BECN set, ECN Not-ECT, 16 zero bytes)
dma_cmd     Out  stream ``{addr: 64, len: 16}``: payload reads (commands with len > 0 only)
dma_data    In   stream of beats: the payload of each DMA command, aligned to lane 0
o_meta      Out  stream of ``record_layout()`` (to ``Deparser.i_meta``)
o           Out  stream of payload beats (to ``Deparser.i``)

Parameters: ``data_width``, ``index_bits``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..flow.layouts import qp_context_layout
from ..net.deparser import frames_span_two_beats
from ..net.layout import beat_layout, record_layout
from ..regmap import GIDS
from .formats import CNP_OPCODE, INLINE_MAX

__all__ = ["PayloadSrc", "tx_desc_layout", "gid_layout", "marking_layout", "CLASSES", "TxBuilder",
           "MAX_PLEN_BITS"]

MAX_PLEN_BITS = 13   # payload bytes per packet: up to 4096 (path MTU)


class PayloadSrc(enum.IntEnum, shape=2):
    NONE = 0       # header-only packet (ACK, READ request, zero-length message)
    DMA = 1        # read plen bytes at addr from host memory
    INLINE = 2     # the descriptor's inline bytes


def tx_desc_layout(index_bits):
    """One packet to transmit, as the transport decides it."""
    return data.StructLayout({
        "qp": index_bits,
        "opcode": 8,
        "psn": 24,
        "ackreq": 1,
        "va": 64,           # RETH
        "rkey": 32,
        "dma_len": 32,
        "imm": 32,          # ImmDt, or IETH rkey
        "syndrome": 8,      # AETH
        "msn": 24,
        "plen": MAX_PLEN_BITS,
        "src": PayloadSrc,
        "addr": 64,         # DMA: bus address of the first payload byte
        "inline": INLINE_MAX * 8,
    })


def gid_layout():
    return data.StructLayout({"mac": 48, "ip": 128, "ipv6": 1})


def marking_layout():
    """DSCP and 802.1p priority written into a packet's headers (``en`` = 1: override the QP's)."""
    return data.StructLayout({"dscp": 6, "pcp": 3, "en": 1})


CLASSES = 8   # traffic classes: the QP's ``sl`` (802.1p priority) selects one


def _src_entry_layout(data_width):
    """A packet's payload source. For inline payloads, ``lastbeat`` (the index of the last beat,
    (plen - 1) // B) and ``lastkeep`` (its byte enables) are worked out when the entry is
    written, so that the payload mux's end of packet, which pops the entry, is one small compare
    of registers (from the beat counter through a subtraction it was 10.8 ns routed on the
    ECPIX-5 core at 41d0b9a)."""
    B = data_width // 8
    return data.StructLayout({"src": PayloadSrc, "plen": MAX_PLEN_BITS, "inline": INLINE_MAX * 8,
                              "lastbeat": range(max(2, -(-INLINE_MAX // B))), "lastkeep": B})


class TxBuilder(wiring.Component):
    def __init__(self, data_width=64, index_bits=4):
        self.data_width = data_width
        self.index_bits = index_bits
        beat = beat_layout(data_width)
        super().__init__({
            "desc":     In(stream.Signature(tx_desc_layout(index_bits))),
            "ctx_addr": Out(index_bits),
            "ctx_en":   Out(1),
            "ctx_data": In(qp_context_layout()),
            "gid":      In(data.ArrayLayout(gid_layout(), GIDS)),
            "tc_mark":  In(data.ArrayLayout(marking_layout(), CLASSES)),
            "cnp_mark": In(marking_layout()),
            "dma_cmd":  Out(stream.Signature(data.StructLayout({"addr": 64, "len": 16}))),
            "dma_data": In(stream.Signature(beat)),
            "o_meta":   Out(stream.Signature(record_layout())),
            "o":        Out(stream.Signature(beat)),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        rec_l = record_layout()
        # The header records waiting for the deparser. Two deep at 512 bits (a record per clock
        # for one-beat frames); one deep (its output register alone) when frames span two beats
        # or more (64 bits): a record every other clock is then as fast as the deparser takes
        # them, and its stage A holds the next record besides the one being emitted, so
        # the records after S1 are still three packets ahead of the wire, enough to hide the
        # DMA read latency behind them and few enough that a go-back-N rewind does not wait
        # behind many committed packets (at 64 bits a rewind then resends one frame fewer). A
        # second entry costs 704 flip-flops in the ECPIX-5 synthesis (LUT4 within 0.3 %) and
        # one more ~850-bit load enable.
        rec_depth = 1 if frames_span_two_beats(self.data_width) else 2
        m.submodules.recq = recq = SyncFIFOBuffered(width=rec_l.size, depth=rec_depth)
        src_l = _src_entry_layout(self.data_width)
        m.submodules.srcq = srcq = SyncFIFOBuffered(width=src_l.size, depth=4)
        m.submodules.cmdq = cmdq = SyncFIFOBuffered(width=80, depth=2)

        # S1 holds one descriptor whose context read is in flight (data valid in S1).
        s1_valid = Signal()
        s1 = Signal(tx_desc_layout(self.index_bits))
        room = Signal()
        m.d.comb += room.eq(recq.w_rdy & srcq.w_rdy & cmdq.w_rdy)
        # With frames of two beats or more (64-bit data) a descriptor every other clock is
        # more than the wire takes, so ``desc.ready`` is S1's own flip-flop, not S1's release
        # through the queues' room: the producer's (the transport's) queue read and S1's load
        # enable then start at flip-flops. At 512 bits a frame can be one beat: ready passes S1
        # on, for a descriptor per clock.
        # Then also the context is registered (ctx_r, a clock after it is read) before the
        # record is built from it, and a descriptor takes three clocks at least (four since
        # gid_r, below): a frame still lasts eight. From the block RAM's output through the GID
        # and traffic-class selects to the record queue it was 10.4 ns routed on the ECPIX-5
        # core at 2c5ea0a.
        # The GID and traffic-class selects are registered too (gid_r, tcm_r, a clock after
        # ctx_r), and a descriptor takes four clocks at least: from ctx_r through the GID select
        # (over the CSR bank's GID registers) into the record queue it missed 125 MHz by 1.0 ns
        # on the ECPIX-5 core at e7458bf.
        registered_ready = frames_span_two_beats(self.data_width)
        s1_ctx = Signal()           # ctx_r holds S1's context
        s1_sel = Signal()           # gid_r and tcm_r hold S1's selections
        push = Signal()
        m.d.comb += push.eq(s1_valid & room & (s1_sel if registered_ready else 1))
        take = Signal()
        ready = ~s1_valid if registered_ready else ~s1_valid | push
        m.d.comb += [
            take.eq(self.desc.valid & ready),
            self.desc.ready.eq(ready),
            self.ctx_addr.eq(self.desc.payload.qp),
            self.ctx_en.eq(take),
        ]
        with m.If(take):
            m.d.sync += [s1.eq(self.desc.payload), s1_valid.eq(1)]
        with m.Elif(push):
            m.d.sync += s1_valid.eq(0)

        # ---------------------------------------------------------------- the header record
        if registered_ready:
            ctx = Signal.like(self.ctx_data, name="ctx_r")
            with m.If(s1_valid & ~s1_ctx):
                m.d.sync += [ctx.eq(self.ctx_data), s1_ctx.eq(1)]
            with m.If(s1_ctx & ~s1_sel):
                m.d.sync += s1_sel.eq(1)
            with m.If(push):
                m.d.sync += [s1_ctx.eq(0), s1_sel.eq(0)]
        else:
            ctx = self.ctx_data
        gid_c = Signal(gid_layout())
        with m.Switch(ctx.sgid_index):
            for i in range(GIDS):
                with m.Case(i):
                    m.d.comb += gid_c.eq(self.gid[i])
        r = Signal(rec_l)
        # DSCP / 802.1p priority: the QP's own (traffic_class, sl), its traffic class's marking
        # when that is enabled, or the CNP marking for CNPs (never ECN-capable: a switch must not
        # mark the notification itself).
        cnp = Signal()
        m.d.comb += cnp.eq(s1.opcode == CNP_OPCODE)
        tcm_c = Signal(marking_layout())
        with m.Switch(ctx.sl):
            for i in range(CLASSES):
                with m.Case(i):
                    m.d.comb += tcm_c.eq(self.tc_mark[i])
        if registered_ready:
            # loaded on every clock: ctx_r holds while S1 waits, so they are S1's from s1_sel on
            gid = Signal(gid_layout(), name="gid_r")
            tcm = Signal(marking_layout(), name="tcm_r")
            m.d.sync += [gid.eq(gid_c), tcm.eq(tcm_c)]
        else:
            gid, tcm = gid_c, tcm_c
        dscp, ecn, pcp = Signal(6), Signal(2), Signal(3)
        with m.If(cnp):
            m.d.comb += [dscp.eq(self.cnp_mark.dscp), ecn.eq(0), pcp.eq(self.cnp_mark.pcp)]
        with m.Elif(tcm.en):
            m.d.comb += [dscp.eq(tcm.dscp), ecn.eq(ctx.traffic_class[0:2]), pcp.eq(tcm.pcp)]
        with m.Else():
            m.d.comb += [dscp.eq(ctx.traffic_class[2:8]), ecn.eq(ctx.traffic_class[0:2]),
                         pcp.eq(ctx.sl)]
        m.d.comb += [
            r.roce.eq(1),
            r.eth_dst.eq(ctx.dst_mac),
            r.eth_src.eq(gid.mac),
            r.vlan.eq(ctx.tx_vlan[12]),
            r.vlan_vid.eq(ctx.tx_vlan[:12]),
            r.vlan_pcp.eq(pcp),
            r.ipv6.eq(ctx.ipv6),
            r.ipv4_ihl.eq(5),
            r.ipv4_dscp.eq(dscp),
            r.ipv4_ecn.eq(ecn),
            r.ipv4_flags.eq(0b010),          # don't fragment, as RoCE NICs send
            r.ipv4_ttl.eq(ctx.hop_limit),
            r.ipv4_src.eq(gid.ip[:32]),
            r.ipv4_dst.eq(ctx.dst_ip[:32]),
            r.ipv6_dscp.eq(dscp),
            r.ipv6_ecn.eq(ecn),
            r.ipv6_flow_label.eq(ctx.flow_label),
            r.ipv6_hop_limit.eq(ctx.hop_limit),
            r.ipv6_src.eq(gid.ip),
            r.ipv6_dst.eq(ctx.dst_ip),
            r.udp_sport.eq(ctx.udp_sport),
            r.bth_opcode.eq(s1.opcode),
            r.bth_pkey.eq(ctx.pkey),
            r.bth_dest_qp.eq(ctx.remote_qpn),
            r.bth_ackreq.eq(s1.ackreq),
            r.bth_becn.eq(cnp),
            r.bth_psn.eq(s1.psn),
            r.reth_va.eq(s1.va),
            r.reth_rkey.eq(s1.rkey),
            r.reth_dma_length.eq(s1.dma_len),
            r.aeth_syndrome.eq(s1.syndrome),
            r.aeth_msn.eq(s1.msn),
            r.immdt_data.eq(s1.imm),
            r.ieth_rkey.eq(s1.imm),
            r.payload_len.eq(s1.plen),
        ]
        src_in = Signal(src_l)
        dma = Signal()
        plen_m1 = Signal(MAX_PLEN_BITS)
        kb = (B - 1).bit_length()       # bits of a byte offset within a beat
        m.d.comb += [
            dma.eq((s1.src == PayloadSrc.DMA) & (s1.plen != 0)),
            src_in.src.eq(Mux(s1.plen == 0, PayloadSrc.NONE, s1.src)),
            src_in.plen.eq(s1.plen),
            src_in.inline.eq(s1.inline),
            plen_m1.eq(s1.plen - 1),
            src_in.lastbeat.eq(plen_m1 >> kb),
            # the last beat holds ((plen - 1) mod B) + 1 bytes
            src_in.lastkeep.eq((Const(1, B + 1) << (plen_m1[:kb] + 1)) - 1),
            recq.w_en.eq(push),
            recq.w_data.eq(r),
            srcq.w_en.eq(push),
            srcq.w_data.eq(src_in),
            cmdq.w_en.eq(push & dma),
            cmdq.w_data.eq(Cat(s1.addr, s1.plen, Const(0, 16 - len(s1.plen)))),
            self.dma_cmd.valid.eq(cmdq.r_rdy),
            self.dma_cmd.payload.eq(cmdq.r_data),
            cmdq.r_en.eq(self.dma_cmd.ready),
            self.o_meta.valid.eq(recq.r_rdy),
            self.o_meta.payload.eq(recq.r_data),
            recq.r_en.eq(self.o_meta.ready),
        ]

        # ---------------------------------------------------------------- payload mux
        head = Signal(src_l)
        m.d.comb += head.eq(srcq.r_data)
        nbeats_inline = -(-INLINE_MAX // B)
        beat = Signal(range(max(2, nbeats_inline)))
        o = self.o
        done = Signal()
        with m.Switch(head.src):
            with m.Case(PayloadSrc.DMA):
                m.d.comb += [
                    o.valid.eq(srcq.r_rdy & self.dma_data.valid),
                    o.payload.eq(self.dma_data.payload),
                    self.dma_data.ready.eq(srcq.r_rdy & o.ready),
                    done.eq(o.valid & o.ready & self.dma_data.payload.last),
                ]
            with m.Case(PayloadSrc.INLINE):
                # Inline bytes [beat*B, beat*B + B) of at most INLINE_MAX.
                last = Signal()
                m.d.comb += last.eq(beat == head.lastbeat)
                chunks = [head.inline[8 * B * i:8 * B * (i + 1)]
                          for i in range(nbeats_inline)]
                with m.Switch(beat):
                    for i, chunk in enumerate(chunks):
                        with m.Case(i):
                            m.d.comb += o.payload.data.eq(chunk)
                keep_bits = Signal(B)
                m.d.comb += keep_bits.eq(Mux(last, head.lastkeep, (1 << B) - 1))
                m.d.comb += [
                    o.valid.eq(srcq.r_rdy),
                    o.payload.keep.eq(keep_bits),
                    o.payload.last.eq(last),
                    done.eq(o.valid & o.ready & last),
                ]
                with m.If(o.valid & o.ready):
                    m.d.sync += beat.eq(Mux(last, 0, beat + 1))
            with m.Default():
                m.d.comb += [
                    o.valid.eq(srcq.r_rdy),
                    o.payload.keep.eq(0),
                    o.payload.last.eq(1),
                    done.eq(o.valid & o.ready),
                ]
        m.d.comb += srcq.r_en.eq(done)
        return m
