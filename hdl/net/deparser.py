# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.4 (encapsulation), A17.8 (ICRC); IBTA Vol 1 ch. 9.2-9.3
#      (BTH and extension headers); RFC 791 (IPv4, header checksum); RFC 8200 (IPv6); RFC 768
"""RoCEv2 deparser: rebuilds the wire frame from a header record and a payload stream.

Stage 1 serializes the headers of a record into two static registers, over three register
stages A, B and C. The *front* holds the frame from byte 0 to the UDP header: Ethernet, the VLAN
tag if any and the IP header (IPv4 with its options or IPv6), the IP header placed at 14 or 18
(one 2:1 multiplexer). The *L4 window* holds UDP, BTH and the opcode's extension headers, moved
by ``udp_off mod B`` bytes (so that it only has to be read by whole words: ``udp_off`` is
always 2 mod 4, so at 64 bits this is again one 2:1 multiplexer) instead of being placed at any
of the 12 possible UDP offsets. Stage A, from the record as it is accepted, builds both (with
the lengths, the IPv4 total length and checksum left zero) and derives the lengths, offsets and
partial sums of the IPv4 header words; B, from A's registers, adds those sums (the raw IPv4 word
sum) and turns the lengths into beat indices for stage 2; C, as the frame enters the emit stage,
folds the sum into the checksum and writes it, the IP and UDP lengths, into the copy the emit
stage reads. At widths where a frame lasts two beats or more (64 bits: at least 8) A keeps its
registers until the frame enters C (B holds only the small per-frame values), so there is one
copy of the headers waiting and one being emitted (there A prepares from its registered copy of
the record, a clock after taking it); at wider widths (512 bits: a 60-byte frame
is one beat) B holds a copy of A's too, so that a record can be accepted on every clock.
Stage 2 emits the frame one beat per clock: header bytes (the front's or the L4 window's word
for the beat, picked per lane at ``udp_off`` and registered a beat ahead), then the payload
shifted into place (a byte shifter over the previous and the current payload beat), zero pad
bytes, the ICRC slot and zero Ethernet padding up to 60 bytes; with each beat it derives which
lanes the ICRC masks, skips or forces to ones, and where the ICRC slot is (none of it depends
on the data, so these controls and the lane selects are registered a beat ahead). Three
registers follow: s2 holds the beat; s3 the beat and its ICRC word, the masked stream delayed
by ``(-end) mod B`` bytes so that the ICRC's last byte ends a word (the init-0 CRC ignores the
zero bytes this puts in front, so there is no partial last word to undo; ``end`` is 2 mod 4, so
the delay is 2 or 6 bytes at 64 bits); the ICRC register is updated from s3's word as its beat
enters s4, and s4 leaves with the finished ICRC written into its slot.

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
beat of a frame leaves 6 cycles after its record is accepted (stages A, B, C, emit, s3, s4);
7 where a frame lasts two beats or more (64 bits), where A takes the record into a register
first and prepares from it a clock later.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..fanout import on_global
from . import headers as H
from .crc import crc_step, materialize
from .icrc import icrc_delayed_word
from .layout import MAX_FRAME_BITS, beat_layout, byteswap, pack_header, record_layout
from .parser import (
    L4_WINDOW,
    POS_BITS,
    UDP_OFFSETS,
    ext_length,
    ones_complement_fold,
)

__all__ = ["Deparser", "MIN_FRAME", "frames_span_two_beats"]

MIN_FRAME = 60


def frames_span_two_beats(data_width):
    """Every frame (at least ``MIN_FRAME`` bytes before the FCS) lasts two beats or more of
    ``data_width`` bits: a stage ahead of the emit stage may then take a record a clock after it
    empties (its ``ready`` a flip-flop) without costing rate. True at 64 bits, not at 512."""
    return -(-MIN_FRAME // (data_width // 8)) >= 2
# The front: every byte before the UDP header (Ethernet + VLAN + IPv4 with 40 option bytes).
FRONT_BYTES = max(UDP_OFFSETS)
# The UDP header starts at 2 mod 4 (14 or 18 + a multiple of 4) and every header after it is a
# multiple of 4 bytes long, as is payload + pad: so the ICRC too starts at 2 mod 4.
assert all(o % 4 == 2 for o in UDP_OFFSETS)
assert all(h.size % 4 == 0 for h in (H.UDP, H.BTH) + H.EXT_HEADERS)
ICRC_MOD4 = 2       # the ICRC's offset mod 4, and the payload's (hlen)


def _adder_tree(m, values, name):
    """Sum of ``values`` as a balanced tree of two-input adders, each kept as its own net:
    Yosys would otherwise merge the tree into one multi-operand adder and build it from LUT
    full adders (two LUT4 per bit and operand) instead of carry chains (half a CCU2C per bit)."""
    values = list(values)
    level = 0
    while len(values) > 1:
        nxt = []
        for i in range(0, len(values), 2):
            if i + 1 < len(values):
                v = values[i] + values[i + 1]
                s = Signal(v.shape(), name=f"{name}_{level}_{i // 2}", attrs={"keep": 1})
                m.d.comb += s.eq(v)
                nxt.append(s)
            else:
                nxt.append(values[i])
        values, level = nxt, level + 1
    return values[0]


def _kept(m, value, name):
    """``materialize`` with the net kept, so that Yosys does not merge the adders on either
    side of it into one multi-operand adder of LUT full adders."""
    sig = Signal(Value.cast(value).shape(), name=name, attrs={"keep": 1})
    m.d.comb += sig.eq(value)
    return sig


def _words(lanes):
    """The big-endian 16-bit words of ``lanes``."""
    return [Cat(lanes[w * 16 + 8:w * 16 + 16], lanes[w * 16:w * 16 + 8])
            for w in range(len(lanes) // 16)]


def _fields(r, h):
    """Header ``h``'s field values from record ``r`` (``<header>_<field>`` members)."""
    return {f.name: r[f"{h.name}_{f.name}"] for f in h.fields}


class HeaderPrep(data.Struct):
    """What stage A derives from a record for stage B (see ``Deparser._prepare``); the headers
    themselves go to the front and L4 window registers."""
    ip_off: 5                   # 14 or 18
    udp_off: 7
    l4_len: 17                  # UDP length: UDP + BTH + extension headers + payload + pad + ICRC
    hlen: 7                     # header bytes before the payload
    end: POS_BITS               # offset of the ICRC
    end4: POS_BITS              # end + 4: stage B pads it to 60 for the frame length
    total: 16                   # IPv4 total length
    csum_hdr: 20                # raw sum of the IPv4 header words (total length and checksum 0)
    csum_opt: 5 * 18            # raw sums of the 16-bit option words 4g .. 4g + 3 (g < 5), those
                                # past the IHL left out: B adds them, csum_hdr and the total length


class FrameLayout(data.Struct):
    raw: 1
    vlan: 1
    hlen: 7
    plen: MAX_FRAME_BITS
    end: POS_BITS
    flen: POS_BITS
    ip_off: 5
    udp_off: 7
    ipv6: 1
    l4_len: 16                  # UDP length (and IPv6 payload length), for stage C
    total: 16                   # IPv4 total length, for stage C
    # derived in stage B for the emit stage (beat indices, so that it compares only its counter)
    first: 8                    # beat of the first payload byte: hlen // B
    jpe: MAX_FRAME_BITS         # first + payload beats to consume (max(1, ceil(plen / B)))
    jl: MAX_FRAME_BITS          # the last beat: ceil(flen / B) - 1
    pay_end: POS_BITS           # hlen + plen
    k: 6                        # (-end) mod B: zero bytes that align the ICRC's end to a beat
    uw: 7                       # udp_off // B: the beat of the UDP header's first byte
    ew: POS_BITS                # end // B: the beat of the ICRC's first byte


class Deparser(wiring.Component):
    def __init__(self, data_width=64):
        assert data_width % 64 == 0
        self.data_width = data_width
        self.nbytes = data_width // 8
        B = self.nbytes
        # the L4 window is read by whole beats: it is moved by udp_off mod B bytes
        self.rots = sorted({o % B for o in UDP_OFFSETS})
        self.nf = -(-FRONT_BYTES // B)                       # front words
        self.nl = -(-(L4_WINDOW + max(self.rots)) // B)      # L4 window words
        super().__init__({
            "i_meta": In(stream.Signature(record_layout())),
            "i": In(stream.Signature(beat_layout(data_width))),
            "o": Out(stream.Signature(beat_layout(data_width))),
        })

    def _rotate(self, m, value, udp_off, name):
        """``value`` (L4 lanes) moved up by ``udp_off mod B`` bytes, over ``nl`` words."""
        B = self.nbytes
        lg = (B - 1).bit_length()
        out = Signal(self.nl * B * 8, name=name)
        if len(self.rots) == 1:
            m.d.comb += out.eq(value << (self.rots[0] * 8))
        else:
            # udp_off is 2 mod 4: its bits 2 .. lg - 1 pick the rotation
            with m.Switch(udp_off[2:lg]):
                for rot in self.rots:
                    with m.Case((rot - 2) // 4):
                        m.d.comb += out.eq(value << (rot * 8))
        return out

    def _prepare(self, m, r):
        """Stage A, from the record ``r`` (combinational): the lengths and offsets, the front
        and the L4 window (lengths and checksum zero) and the IPv4 header's one's complement
        sum without its total length (partial, unfolded sums)."""
        inner = Mux(r.ipv6, H.ETHERTYPE_IPV6, H.ETHERTYPE_IPV4)
        ip_off = Mux(r.vlan, 18, 14)
        ext_len, _known, _payload = ext_length(m, r.bth_opcode, name="tx_ext_len")
        ihl = r.ipv4_ihl
        p = Signal(HeaderPrep)
        pad = Signal(2)
        m.d.comb += pad.eq(-r.payload_len)
        # The adders are balanced by hand (Amaranth folds no constants): at most two after the
        # opcode's decode (ext_len), three deep in all.
        ip_hlen = _kept(m, Mux(r.ipv6, 40, ihl * 4), "ip_hlen")
        udp_off = _kept(m, ip_off + ip_hlen, "udp_off")
        l4_base = _kept(m, Mux(r.vlan, 18 + H.UDP.size + H.BTH.size,
                               14 + H.UDP.size + H.BTH.size) + ext_len, "l4_base")
        hlen = _kept(m, l4_base + ip_hlen, "hlen")
        plen_pad = _kept(m, r.payload_len + pad, "plen_pad")
        plen_pad4 = _kept(m, r.payload_len + (pad + 4), "plen_pad4")
        end = _kept(m, l4_base + _kept(m, ip_hlen + plen_pad, "ip_pay"), "end")
        end4 = _kept(m, l4_base + _kept(m, ip_hlen + plen_pad4, "ip_pay4"), "end4")
        l4_len = _kept(m, (ext_len + (H.UDP.size + H.BTH.size)) + plen_pad4, "l4_len")
        # The checksum's option words: option word w (4 bytes) is in the header when
        # w < ihl - 5. Per group of two words the sum of both and of the first alone, then the
        # one the IHL asks for (the options are not masked in the front: the L4 window
        # overwrites every byte past the IP header).
        opts = r.ipv4_options
        csum_opt = []
        for g in range(H.MAX_IPV4_OPTIONS // 8):
            lo = _adder_tree(m, _words(opts[64 * g:64 * g + 32]), f"ip4_opt{2 * g}")
            hi = _adder_tree(m, _words(opts[64 * g + 32:64 * g + 64]), f"ip4_opt{2 * g + 1}")
            both = _adder_tree(m, [lo, hi], f"ip4_opt{2 * g}_{2 * g + 1}")
            csum_opt.append(Mux(ihl > 2 * g + 6, both, Mux(ihl > 2 * g + 5, lo, 0)))
        ip4_zero = pack_header(H.IPV4, {**_fields(r, H.IPV4), "version": 4,
                                        "protocol": H.IPPROTO_UDP, "total_length": 0,
                                        "checksum": 0})
        ip6_zero = pack_header(H.IPV6, {**_fields(r, H.IPV6), "version": 6, "payload_length": 0,
                                        "next_header": H.IPPROTO_UDP})
        # IPv6 takes 40 bytes: past them the front's bytes are never sent (the L4 window's
        # are), so the IPv4 options there need no multiplexer
        ip4 = Cat(ip4_zero, opts)
        ip = Cat(Mux(r.ipv6, ip6_zero, ip4[:len(ip6_zero)]), ip4[len(ip6_zero):])
        eth = pack_header(H.ETH, _fields(r, H.ETH))[:96]     # addresses; EtherType below
        vlan = pack_header(H.VLAN, {**_fields(r, H.VLAN), "ethertype": inner})
        front = Cat(eth, Mux(r.vlan, Cat(byteswap(Const(H.ETHERTYPE_VLAN, 16), 2), vlan, ip),
                             Cat(byteswap(inner, 2), ip)))
        assert len(front) == FRONT_BYTES * 8
        ext = self._extension_headers(m, r)
        udp = pack_header(H.UDP, {**_fields(r, H.UDP), "dport": H.ROCEV2_UDP_PORT, "length": 0})
        bth = pack_header(H.BTH, {**_fields(r, H.BTH), "pad_count": pad})
        l4 = Cat(udp, bth, ext)
        assert len(l4) == L4_WINDOW * 8
        m.d.comb += [
            p.ip_off.eq(ip_off),
            p.udp_off.eq(udp_off),
            p.l4_len.eq(l4_len),
            p.hlen.eq(hlen),
            p.end.eq(end),
            p.end4.eq(end4),
            p.total.eq(ihl * 4 + l4_len),
            p.csum_hdr.eq(_adder_tree(m, _words(ip4_zero), "ip4_hdr_sum")),
            p.csum_opt.eq(Cat(*csum_opt)),
        ]
        return p, front, self._rotate(m, l4, udp_off, "tx_l4_rot")

    @staticmethod
    def _extension_headers(m, r):
        """The opcode's extension headers, packed (28 bytes). Only the bytes of the opcode's
        own chain are defined (the emit stage sends no byte past the header): every 4-byte
        word (all extension headers are whole words) picks among the words the chains put
        there, by a small index decoded from the opcode, instead of zeroing the rest."""
        by_chain = {}
        for code, op in H.OPCODES.items():
            if op.ext:
                by_chain.setdefault(op.ext, []).append(code)
        packed = {h.name: pack_header(h, _fields(r, h)) for chain in by_chain for h in chain}
        words = []
        for w in range(28 // 4):
            sources, pick = [], {}      # (header, word) this chain puts at word w
            for chain in by_chain:
                pos = 0
                for h in chain:
                    if pos <= 4 * w < pos + h.size:
                        src = (h.name, (4 * w - pos) // 4)
                        if src not in sources:
                            sources.append(src)
                        pick[chain] = sources.index(src)
                    pos += h.size
            data_ = [packed[n][32 * i:32 * i + 32] for n, i in sources]
            if len(data_) <= 1:
                words.append(data_[0] if data_ else Const(0, 32))
                continue
            idx = Signal(range(len(data_)), name=f"tx_ext_pick{w}")
            with m.Switch(r.bth_opcode):
                for chain, codes in by_chain.items():
                    if chain in pick and pick[chain]:
                        with m.Case(*codes):
                            m.d.comb += idx.eq(pick[chain])
            words.append(Cat(*data_).word_select(idx, 32))
        return Cat(*words)

    def _layout(self, m, r, p):
        """Stage B, from the registered record ``r`` and stage A's ``p`` (combinational): the
        IPv4 header's raw word sum (stage C folds it into the checksum) and the frame layout
        with its beat indices for the emit stage."""
        B = self.nbytes
        lg = (B - 1).bit_length()
        # the raw sum of every IPv4 header word; stage C folds it (RFC 1071)
        raw = materialize(m, _adder_tree(m, [p.csum_hdr, p.total]
                                         + [p.csum_opt[18 * g:18 * g + 18]
                                            for g in range(H.MAX_IPV4_OPTIONS // 8)], "ip4_raw"),
                          "ip4_sum_raw")
        lay = Signal(FrameLayout)
        n_pay = Mux(r.payload_len == 0, 1, (r.payload_len + B - 1) >> lg)
        m.d.comb += [
            lay.raw.eq(~r.roce),
            lay.vlan.eq(r.vlan),
            lay.hlen.eq(p.hlen),
            lay.plen.eq(r.payload_len),
            lay.end.eq(p.end),
            lay.flen.eq(Mux(p.end4 > MIN_FRAME, p.end4, MIN_FRAME)),
            lay.ip_off.eq(p.ip_off),
            lay.udp_off.eq(p.udp_off),
            lay.ipv6.eq(r.ipv6),
            lay.l4_len.eq(p.l4_len[:16]),
            lay.total.eq(p.total),
            lay.first.eq(p.hlen >> lg),
            lay.jpe.eq((p.hlen >> lg) + n_pay),
            lay.jl.eq(Mux(p.end4 > MIN_FRAME, p.end4 - 1, MIN_FRAME - 1) >> lg),
            lay.pay_end.eq(p.hlen + r.payload_len),
            lay.k.eq((-p.end)[:lg] if lg else 0),
            lay.uw.eq(p.udp_off >> lg),
            lay.ew.eq(p.end >> lg),
        ]
        return raw, lay

    def _finish(self, m, front, l4, raw, lay):
        """Stage C (combinational): the front and the L4 window of stage A with the IP and UDP
        lengths and the IPv4 checksum (the one's complement of the raw sum ``raw`` folded
        twice; none for IPv6) written into their (zero) fields."""
        csum = materialize(m, ~ones_complement_fold(raw), "ip4_checksum")
        v4 = ~lay.ipv6
        ip_fields = (pack_header(H.IPV4, {"total_length": Mux(v4, lay.total, 0),
                                          "checksum": Mux(v4, csum, 0)})
                     | pack_header(H.IPV6, {"payload_length": Mux(v4, 0, lay.l4_len)})[:160])
        placed = Mux(lay.vlan, ip_fields << (18 * 8), ip_fields << (14 * 8))
        front_full = materialize(m, front | placed, "tx_front_full")
        udp_len = self._rotate(m, pack_header(H.UDP, {"length": lay.l4_len}), lay.udp_off,
                               "tx_udp_len_rot")
        l4_full = materialize(m, l4 | udp_len, "tx_l4_full")
        return front_full, l4_full

    def _icrc_lanes(self, m, jv, lay, lanes_below, name):
        """``icrc_lane_ctrl``'s ``zero``, ``ff`` and ``nib`` lane vectors for beat ``jv``,
        from compares of the beat index: the IP header is at 14 or 18, so its positions are
        constants picked by ``vlan``; those after ``udp_off`` and ``end`` compare ``jv``
        with their beat and a constant with their lane."""
        B = self.nbytes
        lg = (B - 1).bit_length()

        def beat_is(c):
            return materialize(m, jv == c, f"{name}_j{c}")

        def const_lanes(pos):
            """Lanes at the constant offset ``pos`` (an int) in beat ``jv``."""
            hit = beat_is(pos // B)
            return Cat(*(hit if b == pos % B else Const(0, 1) for b in range(B)))

        def const_below(pos):
            """Lanes below the constant offset ``pos``."""
            before = materialize(m, jv < pos // B, f"{name}_lt{pos // B}")
            hit = beat_is(pos // B)
            return Cat(*(before | hit if b < pos % B else before for b in range(B)))

        def ip_lanes(c):
            return Mux(lay.vlan, const_lanes(18 + c), const_lanes(14 + c))

        def var_lanes(pos, c, name_):
            x = materialize(m, pos + c, name_)
            hit = materialize(m, jv == (x >> lg if lg else x), f"{name_}_j")
            return Cat(*(hit & (x[:lg] == b) if lg else hit for b in range(B)))

        below_pre = Mux(lay.vlan, const_below(14), const_below(10))
        below_ip = Mux(lay.vlan, const_below(18), const_below(14))
        below_end = lanes_below(jv, lay.end, f"{name}_end")
        v4 = ip_lanes(1) | ip_lanes(8) | ip_lanes(10) | ip_lanes(11)
        v6 = ip_lanes(1) | ip_lanes(2) | ip_lanes(3) | ip_lanes(7)
        l4 = (var_lanes(lay.udp_off, 6, f"{name}_udp6") | var_lanes(lay.udp_off, 7, f"{name}_udp7")
              | var_lanes(lay.udp_off, 12, f"{name}_udp12"))
        zero = below_pre | ~below_end
        ff = (~below_pre & below_ip) | Mux(lay.ipv6, v6, v4) | l4
        nib = Mux(lay.ipv6, ip_lanes(0), 0)
        return (materialize(m, zero, f"{name}_zero"), materialize(m, ff, f"{name}_ff"),
                materialize(m, nib, f"{name}_nib"))

    def elaborate(self, platform):
        m = Module()
        B = self.nbytes
        lg = (B - 1).bit_length()
        beat = beat_layout(self.data_width)
        # a frame lasts two beats or more: A's registers wait for the emit stage (one copy of
        # the headers waiting, one being read); else B holds a copy, for a record per clock
        hold_a = frames_span_two_beats(self.data_width)

        # ---------------------------------------------------------------- stage 1: headers
        # Three register stages: A (front, L4 window, lengths, offsets, partial sums of the
        # IPv4 header words), B (the raw IPv4 word sum and the frame layout) and C (the emit
        # stage's copy of the headers, with the checksum folded and the lengths written).
        sa_valid = Signal()
        sa_r = Signal(record_layout())
        # Where a frame lasts two beats or more, A prepares from its own copy of the record, a
        # clock after taking it (`sa_ok`): the opcode's decode, the length adders and the L4
        # window's rotation no longer start at the producer's flip-flops (on the ECPIX-5 core
        # that path, with its long net into the deparser, missed 125 MHz by 2.3 ns over 84
        # endpoints). The clock costs no rate (A waits for the frame before to enter C anyway).
        prep_c, front_c, l4_c = self._prepare(m, sa_r if hold_a else self.i_meta.payload)
        sa_ok = Signal()
        sa_p = Signal(HeaderPrep)
        sa_front = Signal(len(front_c))
        sa_l4 = Signal(len(l4_c))
        sa_pop = Signal()
        sb_valid = Signal()
        sb_raw = Signal(21)
        sb = Signal(FrameLayout)
        # B's release loads the emit stage's ~700 header flip-flops: on a global net
        # (``stellar.hdl.fanout``)
        sb_pop_d = Signal()
        sb_pop = on_global(m, "sb_pop_net", sb_pop_d)
        s1_valid = Signal()
        s1_front = Signal(self.nf * B * 8)
        s1_l4 = Signal(self.nl * B * 8)
        s1 = Signal(FrameLayout)
        s1_pop = Signal()
        if hold_a:
            # A is free once its frame enters the emit stage; B is computed once per frame.
            # i_meta.ready is A's own flip-flop, not A's release: a frame lasts two beats or
            # more, so taking the next record a clock after A empties costs no rate, and the
            # producer's queue and A's ~2,000 flip-flops (their common load enable) no longer
            # wait on the emit stage's handshake with the output.
            m.d.comb += [
                self.i_meta.ready.eq(~sa_valid),
                sa_pop.eq(sa_ok & ~sb_valid),
            ]
            free_a = sb_pop
        else:
            m.d.comb += [
                self.i_meta.ready.eq(~sa_valid | sa_pop),
                sa_pop.eq(sa_valid & (~sb_valid | sb_pop)),
            ]
            free_a = sa_pop
        m.d.comb += sb_pop_d.eq(sb_valid & (~s1_valid | s1_pop))
        if hold_a:
            # sa_r holds while A is valid: its prepared values are loaded on every clock, right
            # from the clock after the record (sa_ok: A's record is taken and prepared)
            with m.If(self.i_meta.valid & self.i_meta.ready):
                m.d.sync += [sa_valid.eq(1), sa_r.eq(self.i_meta.payload)]
            with m.Elif(free_a):
                m.d.sync += sa_valid.eq(0)
            m.d.sync += [sa_ok.eq(sa_valid & ~free_a), sa_p.eq(prep_c), sa_front.eq(front_c),
                         sa_l4.eq(l4_c)]
        else:
            with m.If(self.i_meta.valid & self.i_meta.ready):
                m.d.sync += [sa_valid.eq(1), sa_r.eq(self.i_meta.payload), sa_p.eq(prep_c),
                             sa_front.eq(front_c), sa_l4.eq(l4_c)]
            with m.Elif(free_a):
                m.d.sync += sa_valid.eq(0)
        raw_c, lay_c = self._layout(m, sa_r, sa_p)
        with m.If(sa_pop):
            m.d.sync += [sb_valid.eq(1), sb_raw.eq(raw_c), sb.eq(lay_c)]
        with m.Elif(sb_pop):
            m.d.sync += sb_valid.eq(0)
        if hold_a:
            sb_front, sb_l4 = sa_front, sa_l4
        else:
            sb_front, sb_l4 = Signal.like(sa_front), Signal.like(sa_l4)
            with m.If(sa_pop):
                m.d.sync += [sb_front.eq(sa_front), sb_l4.eq(sa_l4)]
        front_full, l4_full = self._finish(m, sb_front, sb_l4, sb_raw, sb)
        # The front and the L4 window enter the emit stage with the frame's layout, on B's
        # release alone (the global net): the beats of the frame read them, and nothing else
        # does. (Loaded with the per-beat registers below, their ~700 load enables came from
        # the output handshake: 10.5 ns routed on the ECPIX-5 core at 41d0b9a.)
        with m.If(sb_pop):
            m.d.sync += [s1_valid.eq(1), s1.eq(sb), s1_front.eq(front_full), s1_l4.eq(l4_full)]
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

        # need (this beat consumes a payload beat), is_last, the beat's header word (hdr),
        # which lanes take header bytes (hsel) or payload bytes (psel) and the ICRC controls,
        # all registered for the beat to come (from j_next = j + 1, or for beat 0 from stage
        # B's layout as a frame enters the emit stage). So the ready chain (output -> payload
        # input -> record input) starts at flip-flops and the beat is two multiplexer levels
        # after the payload shifter.
        need = Signal()
        is_last = Signal()
        j_next = Signal.like(j, init=1)
        hdr = Signal(B * 8)
        hsel = Signal(B)
        psel = Signal(B)
        # a lane whose payload byte comes from ``cur`` when no payload beat is consumed is
        # past the payload (or a header lane): psel zeroes it, so ``cur`` needs no mask
        cur = self.i.payload.data
        # the payload starts at hlen, 2 mod 4 (like udp_off): the byte shifter picks among B/4
        # positions, hlen[2:] (a 2:1 multiplexer at 64 bits)
        pay = Cat(prev, cur)[(4 - ICRC_MOD4) * 8:].bit_select(
            (~s1.hlen[2:lg]).as_unsigned() * 32, B * 8)
        pay = materialize(m, pay, "pay")
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

        def lanes_below(jv, x, name):
            """Which lanes of beat ``jv`` are at byte offsets below ``x``: one compare and one
            equality of the beat index with ``x // B`` for all lanes, then per lane a compare
            of ``x mod B`` with a constant (not a full-width compare per lane)."""
            if not lg:
                return materialize(m, jv < x, name)
            xw, xl = x >> lg, x[:lg]
            before = materialize(m, jv < xw, f"{name}_before")
            at_w = materialize(m, jv == xw, f"{name}_at")
            return materialize(m, Cat(*(before | (at_w & (xl > b)) for b in range(B))), name)

        def header_word(jv, lay, front, l4, skip0=False):
            """The header word of beat ``jv``: per lane the front's byte before ``udp_off``,
            the L4 window's from there (L4 word ``jv - udp_off // B``)."""
            nfb = max(1, (self.nf - 1).bit_length())
            nlb = max(1, (self.nl - 1).bit_length())
            if skip0 and self.nf > 1:
                # beat 0 is read from stage C's input instead: the front's word 0 is not kept
                front = Cat(Const(0, B * 8), front[B * 8:])
            fw = front.word_select(jv[:nfb], B * 8) if self.nf > 1 else front
            lw = l4.word_select((jv - lay.uw)[:nlb], B * 8) if self.nl > 1 else l4
            fsel = lanes_below(jv, lay.udp_off, "tx_fsel")
            return Cat(*(Mux(fsel[b], fw[b * 8:b * 8 + 8], lw[b * 8:b * 8 + 8])
                         for b in range(B)))

        def icrc_ctrl(jv, lay, name, jprev=None):
            """The beat ``jv``'s ICRC lane controls (``zero``, ``ff``, ``nib``), ICRC slot
            (the lanes that hold ICRC bytes: the slot starts at ``end``, 2 mod 4, so lane b
            holds ICRC byte (b - 2) mod 4) and whether the beat updates the ICRC, from the
            frame layout ``lay``; ``jprev`` is beat ``jv - 1`` (None for beat 0)."""
            zero, ff, nib = self._icrc_lanes(m, jv, lay, lanes_below, name)
            el = lay.end[:lg] if lg else Const(0, 1)
            in_ew = materialize(m, jv == lay.ew, f"{name}_in_ew")
            in_ew1 = materialize(m, jprev == lay.ew, f"{name}_in_ew1") if jprev is not None \
                else Const(0, 1)
            ov_hit = []
            for b in range(B):
                here = in_ew & (el <= b) & (el + 4 > b)
                spill = in_ew1 & (el + 4 > b + B)
                ov_hit.append(here | spill)
            return [zero, ff, nib, Cat(*ov_hit), at(0, jv) < lay.end]

        # the ICRC controls, registered for the beat to come like hsel / psel
        e_ctrl = [Signal(B, name="e_zero"), Signal(B, name="e_ff"), Signal(B, name="e_nib"),
                  Signal(B, name="e_ov_hit"), Signal(name="e_update")]
        zero, ff, nib, ov_hit, update = e_ctrl
        e_next = icrc_ctrl(j_next, s1, "tx_icrc", jprev=j)
        e_first = icrc_ctrl(Const(0, len(j)), sb, "tx_icrc0")
        if B > min(UDP_OFFSETS):
            hdr_first = header_word(Const(0, len(j)), sb, front_full, l4_full)
        else:
            hdr_first = front_full[:B * 8]

        lc = data.StructLayout({
            "beat": beat, "raw": 1, "first": 1, "update": 1, "k": 6,
            "zero": B, "ff": B, "nib": B, "ov_hit": B,
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
                s2.zero.eq(zero), s2.ff.eq(ff), s2.nib.eq(nib), s2.ov_hit.eq(ov_hit),
            ]
        # The per-beat registers load on a beat (proc) or as a frame enters (sb_pop); which
        # value is chosen from registers only (not through the handshake): the next frame's
        # beat 0 from stage B's layout after a frame's last beat or into an idle emit stage
        # (without sb_pop that value is stale and is loaded again by sb_pop, which comes before
        # the frame's first beat), else the frame's next beat. (The front and the L4 window
        # load with the frame's layout, above, and are read, not shifted, by its beats.)
        with m.If(proc | sb_pop):
            with m.If(done | ~s1_valid):
                m.d.sync += [
                    need.eq(sb.raw | (sb.first == 0)), is_last.eq(sb.jl == 0),
                    hdr.eq(hdr_first),
                    hsel.eq(Cat(*(b < sb.hlen for b in range(B)))),
                    psel.eq(Cat(*(b < sb.pay_end for b in range(B)))),
                ]
                m.d.sync += [r.eq(v) for r, v in zip(e_ctrl, e_first, strict=True)]
            with m.Else():
                m.d.sync += [
                    need.eq(s1.raw | ((j_next >= s1.first) & (j_next < s1.jpe))),
                    is_last.eq(j_next == s1.jl),
                    hdr.eq(header_word(j_next, s1, s1_front, s1_l4, skip0=True)),
                    hsel.eq(lanes_below(j_next, s1.hlen, "tx_hsel")),
                    psel.eq(lanes_below(j_next, s1.pay_end, "tx_psel")),
                ]
                m.d.sync += [r.eq(v) for r, v in zip(e_ctrl, e_next, strict=True)]
        masked, word = icrc_delayed_word(m, s2.beat.data, s2.zero, s2.ff, s2.nib, s2.first, s2.k,
                                         prev_masked, B, "tx_icrc", k_mod4=(-ICRC_MOD4) % 4)
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
        with_icrc = Cat(*(Mux(s4.ov_hit[b], value[((b - ICRC_MOD4) % 4) * 8:][:8],
                              s4.beat.data[b * 8:b * 8 + 8]) for b in range(B)))
        m.d.comb += [
            self.o.valid.eq(s4_valid),
            self.o.payload.keep.eq(s4.beat.keep),
            self.o.payload.last.eq(s4.beat.last),
            self.o.payload.data.eq(Mux(s4.raw, s4.beat.data, with_icrc)),
        ]
        return m
