# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.4 (encapsulation), A17.8 (ICRC); IBTA Vol 1 ch. 9.2-9.3
#      (BTH and extension headers); RFC 791 (IPv4, header checksum); RFC 8200 (IPv6); RFC 768
"""RoCEv2 deparser: rebuilds the wire frame from a header record and a payload stream.

Stage 1 serializes every header from the record into a 128-byte header window at the offsets the
record implies (VLAN or not, IPv4 with options or IPv6, the opcode's extension headers),
computing on the way the lengths (IPv4 total length / IPv6 payload length, UDP length), the BTH
pad count, the EtherTypes and the IPv4 header checksum, over three registers: A derives the
lengths, offsets, extension headers and partial sums of the IPv4 header words (without the total
length), B the window (checksum 0) and the header's raw word sum, C folds that sum into the
checksum and writes it into the window; B also turns the lengths into beat indices for stage 2.
Stage 2 emits the frame one beat per clock: header bytes, then the payload shifted into place (a
byte shifter over the previous and the current payload beat), zero pad bytes, the ICRC slot and
zero Ethernet padding up to 60 bytes; with each beat it derives which lanes the ICRC masks,
skips or forces to ones, and where the ICRC slot is (none of it depends on the data, so these
controls and the lane selects are registered a beat ahead, and the header window shifts down one
word per beat). Three registers follow: s2 holds the beat; s3 the beat and its ICRC word, the
masked stream delayed by ``(-end) mod B`` bytes so that the ICRC's last byte ends a word (the
init-0 CRC ignores the zero bytes this puts in front, so there is no partial last word to undo);
the ICRC register is updated from s3's word as its beat enters s4, and s4 leaves with the
finished ICRC written into its slot.

Ports:
  ``i_meta``  in   stream of header records (``layout.record_layout()``), one per frame. With
                   ``roce == 0`` the payload stream is a whole frame, emitted unchanged.
  ``i``       in   stream of payload beats (data, keep, last) aligned to lane 0:
                   ``max(1, ceil(payload_len / B))`` beats per frame, the last one with ``last``.
  ``o``       out  stream of Ethernet frames without FCS.

Parameters: ``data_width`` (64 or 512 bits).

Record fields the deparser computes (their record values are ignored): eth_ethertype,
vlan_ethertype, ipv4_version, ipv4_total_length, ipv4_protocol, ipv4_checksum, ipv6_version,
ipv6_payload_length, ipv6_next_header, udp_dport, udp_length, bth_pad_count; ``ipv4_ihl`` and
``ipv4_options`` must agree (options bytes past ``(ihl-5)*4`` are ignored). Pad bytes are zero.

Throughput: one output beat per clock; frames back to back without bubbles. Latency: the first
beat of a frame leaves 6 cycles after its record is accepted (stages A, B, C, emit, s3, s4).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from . import headers as H
from .crc import crc_step, materialize
from .icrc import icrc_delayed_word, icrc_lane_ctrl
from .layout import MAX_FRAME_BITS, beat_layout, pack_header, record_layout
from .parser import (
    HEADER_WINDOW,
    L4_WINDOW,
    POS_BITS,
    UDP_OFFSETS,
    ext_length,
    ones_complement_fold,
    tree_sum,
)

__all__ = ["Deparser"]

MIN_FRAME = 60


def _words_sum(lanes):
    """Raw sum of the big-endian 16-bit words of ``lanes`` (a balanced adder tree)."""
    return tree_sum([Cat(lanes[w * 16 + 8:w * 16 + 16], lanes[w * 16:w * 16 + 8])
                     for w in range(len(lanes) // 16)])


def _fields(r, h):
    """Header ``h``'s field values from record ``r`` (``<header>_<field>`` members)."""
    return {f.name: r[f"{h.name}_{f.name}"] for f in h.fields}


class HeaderPrep(data.Struct):
    """What stage A derives from a record for stage B (see ``Deparser._prepare``)."""
    inner: 16                   # EtherType of the IP header
    ip_off: 5                   # 14 or 18
    pad: 2                      # BTH pad count
    udp_off: 7
    l4_len: 17                  # UDP length: UDP + BTH + extension headers + payload + pad + ICRC
    hlen: 7                     # header bytes before the payload
    end: POS_BITS               # offset of the ICRC
    end4: POS_BITS              # end + 4: stage B pads it to 60 for the frame length
    options: H.MAX_IPV4_OPTIONS * 8     # IPv4 options, bytes past (ihl - 5) * 4 zeroed
    ext: 28 * 8                 # extension headers packed by opcode
    total: 16                   # IPv4 total length
    csum_hdr: 20                # raw sum of the IPv4 header words (total length and checksum 0)
    csum_opt: 5 * 18            # raw sums of the 16-bit option words 4g .. 4g + 3 (g < 5): B
                                # adds them, csum_hdr and the total length


class FrameLayout(data.Struct):
    raw: 1
    hlen: 7
    plen: MAX_FRAME_BITS
    end: POS_BITS
    flen: POS_BITS
    ip_off: 5
    udp_off: 7
    ipv6: 1
    # derived in stage B for the emit stage (beat indices, so that it compares only its counter)
    first: 8                    # beat of the first payload byte: hlen // B
    jpe: MAX_FRAME_BITS         # first + payload beats to consume (max(1, ceil(plen / B)))
    jl: MAX_FRAME_BITS          # the last beat: ceil(flen / B) - 1
    pay_end: POS_BITS           # hlen + plen
    k: 6                        # (-end) mod B: zero bytes that align the ICRC's end to a beat


class Deparser(wiring.Component):
    def __init__(self, data_width=64):
        assert data_width % 64 == 0
        self.data_width = data_width
        self.nbytes = data_width // 8
        super().__init__({
            "i_meta": In(stream.Signature(record_layout())),
            "i": In(stream.Signature(beat_layout(data_width))),
            "o": Out(stream.Signature(beat_layout(data_width))),
        })

    @staticmethod
    def _prepare(m, r):
        """Stage A, from the record ``r`` (combinational): the lengths and offsets, the IPv4
        options masked to ``ihl``, the extension headers packed by opcode and the IPv4 header's
        one's complement sum without its total length (a raw, unfolded sum)."""
        inner = Mux(r.ipv6, H.ETHERTYPE_IPV6, H.ETHERTYPE_IPV4)
        ip_off = Mux(r.vlan, 18, 14)
        ext_len, _known, _payload = ext_length(m, r.bth_opcode, name="tx_ext_len")
        ihl = r.ipv4_ihl
        p = Signal(HeaderPrep)
        pad = Signal(2)
        m.d.comb += pad.eq(-r.payload_len)
        # The adders are balanced by hand (Amaranth folds no constants): at most three deep.
        ip_hlen = materialize(m, Mux(r.ipv6, 40, ihl * 4), "ip_hlen")
        udp_off = materialize(m, ip_off + ip_hlen, "udp_off")
        l4_base = materialize(m, Mux(r.vlan, 18 + H.UDP.size + H.BTH.size,
                                     14 + H.UDP.size + H.BTH.size) + ext_len, "l4_base")
        hlen = materialize(m, l4_base + ip_hlen, "hlen")
        plen_pad = materialize(m, r.payload_len + pad, "plen_pad")
        plen_pad4 = materialize(m, r.payload_len + (pad + 4), "plen_pad4")
        end = materialize(m, hlen + plen_pad, "end")
        end4 = materialize(m, hlen + plen_pad4, "end4")
        l4_len = materialize(m, (ext_len + (H.UDP.size + H.BTH.size)) + plen_pad4, "l4_len")
        # option word w (4 bytes) is in the header when w < ihl - 5: one compare per word
        options = Cat(*(Mux(ihl > w + 5, r.ipv4_options[32 * w:32 * w + 32], 0)
                        for w in range(H.MAX_IPV4_OPTIONS // 4)))
        options = materialize(m, options, "ip4_options")
        ip4_zero = pack_header(H.IPV4, {**_fields(r, H.IPV4), "version": 4,
                                        "protocol": H.IPPROTO_UDP, "total_length": 0,
                                        "checksum": 0})
        ext = Signal(28 * 8)
        by_chain = {}
        for code, op in H.OPCODES.items():
            by_chain.setdefault(op.ext, []).append(code)
        with m.Switch(r.bth_opcode):
            for chain, codes in by_chain.items():
                if not chain:
                    continue
                with m.Case(*codes):
                    m.d.comb += ext.eq(Cat(*(pack_header(h, _fields(r, h)) for h in chain)))
        m.d.comb += [
            p.inner.eq(inner),
            p.ip_off.eq(ip_off),
            p.pad.eq(pad),
            p.udp_off.eq(udp_off),
            p.l4_len.eq(l4_len),
            p.hlen.eq(hlen),
            p.end.eq(end),
            p.end4.eq(end4),
            p.options.eq(options),
            p.ext.eq(ext),
            p.total.eq(ihl * 4 + l4_len),
            p.csum_hdr.eq(_words_sum(ip4_zero)),
            p.csum_opt.eq(Cat(*(_words_sum(options[64 * g:64 * g + 64])
                                for g in range(H.MAX_IPV4_OPTIONS // 8)))),
        ]
        return p

    @staticmethod
    def _assemble(m, r, p):
        """Stage B, from the registered record ``r`` and stage A's ``p`` (combinational): the
        header window (lanes) with a zero IPv4 checksum, the IPv4 header's raw word sum (stage
        C folds it into the checksum) and the frame layout."""
        total = p.total
        # the raw sum of every IPv4 header word; stage C folds it (RFC 1071)
        raw = materialize(m, tree_sum([p.csum_hdr, total]
                                      + [p.csum_opt[18 * g:18 * g + 18]
                                         for g in range(H.MAX_IPV4_OPTIONS // 8)]),
                          "ip4_sum_raw")
        eth = pack_header(H.ETH, {**_fields(r, H.ETH),
                                  "ethertype": Mux(r.vlan, H.ETHERTYPE_VLAN, p.inner)})
        vlan = pack_header(H.VLAN, {**_fields(r, H.VLAN), "ethertype": p.inner})
        ip4 = Cat(pack_header(H.IPV4, {**_fields(r, H.IPV4), "version": 4,
                                       "protocol": H.IPPROTO_UDP, "total_length": total,
                                       "checksum": 0}), p.options)
        ip6 = pack_header(H.IPV6, {**_fields(r, H.IPV6), "version": 6,
                                   "payload_length": p.l4_len[:16],
                                   "next_header": H.IPPROTO_UDP})
        udp = pack_header(H.UDP, {**_fields(r, H.UDP), "dport": H.ROCEV2_UDP_PORT,
                                  "length": p.l4_len[:16]})
        bth = pack_header(H.BTH, {**_fields(r, H.BTH), "pad_count": p.pad})
        l4 = Cat(udp, bth, p.ext)
        assert len(l4) == L4_WINDOW * 8

        win = Signal(HEADER_WINDOW * 8)
        ip = materialize(m, Mux(r.ipv6, ip6, ip4), "ip_hdr")
        l4 = materialize(m, l4, "l4_hdr")
        placed_l4 = Signal(HEADER_WINDOW * 8)
        with m.Switch(p.udp_off):
            for off in UDP_OFFSETS:
                with m.Case(off):
                    m.d.comb += placed_l4.eq(l4 << (off * 8))
        m.d.comb += win.eq(
            eth
            | Mux(r.vlan, vlan << (14 * 8), 0)
            | Mux(r.vlan, ip << (18 * 8), ip << (14 * 8))
            | placed_l4)

        lay = Signal(FrameLayout)
        m.d.comb += [
            lay.raw.eq(~r.roce),
            lay.hlen.eq(p.hlen),
            lay.plen.eq(r.payload_len),
            lay.end.eq(p.end),
            lay.flen.eq(Mux(p.end4 > MIN_FRAME, p.end4, MIN_FRAME)),
            lay.ip_off.eq(p.ip_off),
            lay.udp_off.eq(p.udp_off),
            lay.ipv6.eq(r.ipv6),
        ]
        return win, raw, lay

    @staticmethod
    def _checksum(m, win, raw, vlan, ipv6):
        """Stage C (combinational): the window ``win`` of stage B with the IPv4 checksum, the
        one's complement of the raw sum ``raw`` folded twice, in its place (none for IPv6)."""
        csum = materialize(m, ~ones_complement_fold(raw), "ip4_checksum")
        field = pack_header(H.IPV4, {"checksum": csum})
        placed = Mux(vlan, field << (18 * 8), field << (14 * 8))
        return win | Mux(ipv6, 0, placed)

    def _beats(self, m, r, p, lay):
        """Stage B's per-frame beat indices for the emit stage (``FrameLayout.first`` ..)."""
        B = self.nbytes
        lg = (B - 1).bit_length()
        n_pay = Mux(r.payload_len == 0, 1, (r.payload_len + B - 1) >> lg)
        m.d.comb += [
            lay.first.eq(p.hlen >> lg),
            lay.jpe.eq((p.hlen >> lg) + n_pay),
            lay.jl.eq(Mux(p.end4 > MIN_FRAME, p.end4 - 1, MIN_FRAME - 1) >> lg),
            lay.pay_end.eq(p.hlen + r.payload_len),
            lay.k.eq((-p.end)[:lg] if lg else 0),
        ]

    def elaborate(self, platform):
        m = Module()
        B = self.nbytes
        lg = (B - 1).bit_length()
        NW = -(-HEADER_WINDOW // B)
        beat = beat_layout(self.data_width)

        # ---------------------------------------------------------------- stage 1: headers
        # Three register stages: A (lengths, offsets, options, extension headers, partial sums
        # of the IPv4 header words), B (the header window, the raw IPv4 word sum) and C (the
        # checksum folded and written into the window). In one clock the chain opcode ->
        # lengths -> checksum adders -> window placement was 17 logic levels, 16 ns on an ECP5
        # at speed 8; with the fold in B, 8.6 ns.
        prep_c = self._prepare(m, self.i_meta.payload)
        sa_valid = Signal()
        sa_r = Signal(record_layout())
        sa_p = Signal(HeaderPrep)
        sa_pop = Signal()
        sb_valid = Signal()
        sb_win = Signal(HEADER_WINDOW * 8)
        sb_raw = Signal(21)
        sb_vlan = Signal()
        sb = Signal(FrameLayout)
        sb_pop = Signal()
        s1_valid = Signal()
        s1_win = Signal(NW * B * 8)
        s1 = Signal(FrameLayout)
        s1_pop = Signal()
        m.d.comb += [
            self.i_meta.ready.eq(~sa_valid | sa_pop),
            sa_pop.eq(sa_valid & (~sb_valid | sb_pop)),
            sb_pop.eq(sb_valid & (~s1_valid | s1_pop)),
        ]
        with m.If(self.i_meta.valid & self.i_meta.ready):
            m.d.sync += [sa_valid.eq(1), sa_r.eq(self.i_meta.payload), sa_p.eq(prep_c)]
        with m.Elif(sa_pop):
            m.d.sync += sa_valid.eq(0)
        win_c, raw_c, lay_c = self._assemble(m, sa_r, sa_p)
        self._beats(m, sa_r, sa_p, lay_c)
        with m.If(sa_pop):
            m.d.sync += [sb_valid.eq(1), sb_win.eq(win_c), sb_raw.eq(raw_c),
                         sb_vlan.eq(sa_r.vlan), sb.eq(lay_c)]
        with m.Elif(sb_pop):
            m.d.sync += sb_valid.eq(0)
        win_full = materialize(m, self._checksum(m, sb_win, sb_raw, sb_vlan, sb.ipv6), "win_full")
        with m.If(sb_pop):
            m.d.sync += [s1_valid.eq(1), s1.eq(sb)]
        with m.Elif(s1_pop):
            m.d.sync += s1_valid.eq(0)

        # ---------------------------------------------------------------- stage 2: emit
        # The emit stage builds one beat per clock from its beat counter ``j`` and the frame's
        # registered layout; with it, the data-independent ICRC lane controls and ICRC slot
        # positions. Then three registers, advancing together whenever the output is free:
        #   s2  the beat and its lane controls;
        #   s3  the beat and its ICRC word: the masked stream delayed by k = (-end) mod B bytes,
        #       so that the ICRC's last byte ends a word (leading zeros are no-ops for the
        #       init-0 CRC, so no trailing zero padding has to be undone);
        #   s4  the beat, leaving with the ICRC (updated from s3's word as the beat enters s4)
        #       written into its slot.
        j = Signal(range(1 << (POS_BITS - lg)))
        prev = Signal(self.data_width)

        s2_valid, s3_valid, s4_valid = Signal(), Signal(), Signal()
        adv = ~s4_valid | self.o.ready

        def at(b, jv=j):
            return Cat(Const(b, lg), jv) if lg else jv

        shift = s1.hlen[:lg] if lg else Const(0, 1)
        # need (this beat consumes a payload beat), is_last, which lanes take header bytes
        # (hsel) or payload bytes (psel) and the ICRC controls, all registered for the beat to
        # come (from j_next = j + 1, or for beat 0 from stage B's layout as a frame enters the
        # emit stage); the header window shifts down one word per beat. So the ready chain
        # (output -> payload input -> record input) starts at flip-flops and the beat is two
        # multiplexer levels after the payload shifter.
        need = Signal()
        is_last = Signal()
        j_next = Signal.like(j, init=1)
        hsel = Signal(B)
        psel = Signal(B)
        # a lane whose payload byte comes from ``cur`` when no payload beat is consumed is
        # past the payload (or a header lane): psel zeroes it, so ``cur`` needs no mask
        cur = self.i.payload.data
        if lg:
            pay = Cat(prev, cur).bit_select((B - shift).as_unsigned() * 8, B * 8)
        else:
            pay = cur
        pay = materialize(m, pay, "pay")
        # the window shifts down one word per beat: its low word is the beat's header word
        hdr = s1_win[:B * 8]
        lanes, keep_last = [], []
        for b in range(B):
            lanes.append(Mux(hsel[b], hdr[b * 8:b * 8 + 8], Mux(psel[b], pay[b * 8:b * 8 + 8], 0)))
            keep_last.append(Const(b, lg) < s1.flen[:lg] if lg else Const(0, 1))
        # flen % B == 0: the last beat is full
        keep_last = Mux(s1.flen[:lg] == 0, (1 << B) - 1, Cat(*keep_last)) if lg else Const(1, 1)
        built = Signal(beat)
        m.d.comb += [
            built.data.eq(Cat(*lanes)),
            built.keep.eq(Mux(is_last, keep_last, (1 << B) - 1)),
            built.last.eq(is_last),
        ]
        out = Signal(beat)
        m.d.comb += out.eq(Mux(s1.raw, self.i.payload, built))

        proc = s1_valid & adv & (~need | self.i.valid)
        done = Mux(s1.raw, self.i.payload.last, is_last)
        m.d.comb += [
            self.i.ready.eq(proc & need),
            s1_pop.eq(proc & done),
        ]
        def icrc_ctrl(jv, lay, name):
            """The beat ``jv``'s ICRC lane controls (``zero``, ``ff``, ``nib``), ICRC slot
            (lane b holds ICRC byte (b + base - end) when that is 0..3) and whether the beat
            updates the ICRC, from the frame layout ``lay``."""
            zero, ff, nib = icrc_lane_ctrl(m, at(0, jv), lay.ip_off, lay.udp_off, lay.ipv6,
                                           lay.end, B, name=name)
            ov_hit, ov_idx = [], []
            for b in range(B):
                d = materialize(m, (at(b, jv) - lay.end)[:POS_BITS], f"{name}_ov{b}")
                ov_hit.append(d < 4)
                ov_idx.append(d[:2])
            return [zero, ff, nib, Cat(*ov_hit), Cat(*ov_idx), at(0, jv) < lay.end]

        # the ICRC controls, registered for the beat to come like hsel / psel
        e_ctrl = [Signal(B, name="e_zero"), Signal(B, name="e_ff"), Signal(B, name="e_nib"),
                  Signal(B, name="e_ov_hit"), Signal(2 * B, name="e_ov_idx"),
                  Signal(name="e_update")]
        zero, ff, nib, ov_hit, ov_idx, update = e_ctrl
        e_next = icrc_ctrl(j_next, s1, "tx_icrc")
        e_first = icrc_ctrl(Const(0, len(j)), sb, "tx_icrc0")

        lc = data.StructLayout({
            "beat": beat, "raw": 1, "first": 1, "update": 1, "k": 6,
            "zero": B, "ff": B, "nib": B, "ov_hit": B, "ov_idx": 2 * B,
        })
        s2 = Signal(lc)
        s3 = Signal(lc)
        s4 = Signal(lc)
        s3_word = Signal(self.data_width)
        prev_masked = Signal(self.data_width)
        crc = Signal(32)
        with m.If(adv):
            m.d.sync += [s2_valid.eq(proc), s3_valid.eq(s2_valid), s4_valid.eq(s3_valid)]
        with m.If(proc):
            m.d.sync += [
                j.eq(Mux(done, 0, j_next)),
                j_next.eq(Mux(done, 1, j_next + 1)),
            ]
            with m.If(need):
                m.d.sync += prev.eq(cur)
            m.d.sync += [
                s2.beat.eq(out), s2.raw.eq(s1.raw), s2.first.eq(j == 0),
                s2.update.eq(update), s2.k.eq(s1.k),
                s2.zero.eq(zero), s2.ff.eq(ff), s2.nib.eq(nib),
                s2.ov_hit.eq(ov_hit), s2.ov_idx.eq(ov_idx),
            ]
        # The per-beat registers load on a beat (proc) or as a frame enters (sb_pop); which
        # value is chosen from registers only (not through the handshake): the next frame's
        # beat 0 from stage B's layout after a frame's last beat or into an idle emit stage
        # (without sb_pop that value is stale and is loaded again by sb_pop, which comes before
        # the frame's first beat), else the frame's next beat.
        with m.If(proc | sb_pop):
            with m.If(done | ~s1_valid):
                m.d.sync += [
                    need.eq(sb.raw | (sb.first == 0)), is_last.eq(sb.jl == 0),
                    s1_win.eq(win_full),
                    hsel.eq(Cat(*(b < sb.hlen for b in range(B)))),
                    psel.eq(Cat(*(b < sb.pay_end for b in range(B)))),
                ]
                m.d.sync += [r.eq(v) for r, v in zip(e_ctrl, e_first, strict=True)]
            with m.Else():
                m.d.sync += [
                    need.eq(s1.raw | ((j_next >= s1.first) & (j_next < s1.jpe))),
                    is_last.eq(j_next == s1.jl),
                    s1_win.eq(s1_win >> (B * 8)),
                    hsel.eq(Cat(*(at(b, j_next) < s1.hlen for b in range(B)))),
                    psel.eq(Cat(*(at(b, j_next) < s1.pay_end for b in range(B)))),
                ]
                m.d.sync += [r.eq(v) for r, v in zip(e_ctrl, e_next, strict=True)]
        masked, word = icrc_delayed_word(m, s2.beat.data, s2.zero, s2.ff, s2.nib, s2.first, s2.k,
                                         prev_masked, B, "tx_icrc")
        with m.If(adv & s2_valid):
            m.d.sync += [s3.eq(s2), s3_word.eq(word), prev_masked.eq(masked)]
        # (built outside the If: comb statements inside it would gate the CRC's inputs)
        crc_next = crc_step(m, Mux(s3.first, 0, crc), s3_word, name="tx_icrc_crc")
        with m.If(adv & s3_valid):
            m.d.sync += s4.eq(s3)
            with m.If(s3.update):
                m.d.sync += crc.eq(crc_next)

        # ---------------------------------------------------------------- ICRC slot
        value = crc ^ 0xFFFFFFFF
        with_icrc = Cat(*(Mux(s4.ov_hit[b], value.word_select(s4.ov_idx[2 * b:2 * b + 2], 8),
                              s4.beat.data[b * 8:b * 8 + 8]) for b in range(B)))
        m.d.comb += [
            self.o.valid.eq(s4_valid),
            self.o.payload.keep.eq(s4.beat.keep),
            self.o.payload.last.eq(s4.beat.last),
            self.o.payload.data.eq(Mux(s4.raw, s4.beat.data, with_icrc)),
        ]
        return m
