# Ref: IBTA Vol 1 Annex A17 (RoCEv2) A17.4 (encapsulation), A17.8 (ICRC); IBTA Vol 1 ch. 9.2-9.3
#      (BTH and extension headers); RFC 791 (IPv4, header checksum); RFC 8200 (IPv6); RFC 768
"""RoCEv2 header parser with ICRC and IPv4 header checksum check.

Stage A reads the header from the first 128 bytes of each frame (the longest header Stellar
parses is 126 bytes: Ethernet + VLAN + IPv4 with 40 bytes of options + UDP + BTH + AtomicETH)
while every beat also goes into a small data FIFO. It keeps the Ethernet and VLAN headers in a
small window register and captures two more windows from the beats as they pass, each byte from
the beat and lane where the frame's offsets put it (the beat selected by the flip-flops'
enables, not by a mux on the offset): the IP header window (the 64 bytes from offset 14, with
or without a VLAN tag) and the L4 window (UDP, BTH and the longest extension-header chain, at
one of 12 offsets). One cycle after the header bytes have passed (beat ``ceil(128/B) - 1`` of
the frame, or its last beat if shorter), the decoder extracts the fields, classifies the frame
and checks its header, and pushes a small *decision* (offsets and lengths) and the header
*record*. The decoder is a pipeline of ``DECODE_STAGES`` (4) registers (the Ethernet bytes
with the EtherType decode; the IP header bytes, the IP offsets, lengths and eight partial
checksum sums; the opcode's decode, the framing checks and the checksum's sum; the lengths and
the decision), one decision per clock. The record is written to its FIFO after the second
(``RECORD_STAGES``): its ``payload_len`` comes with the frame's last output beat, from the
decision. With ``record_fields``, the record holds (and the decoder extracts) only those fields.

Stage B reads the frame back from the data FIFO with one beat of look-ahead, feeds the masked
beats to the ICRC, and re-aligns the payload to byte 0 of its own beats (a byte shifter over the
current and the next beat, so each input beat yields at most one output beat: no flush cycle,
no bubble between frames). The last payload beat is held until the frame's last beat has been
checked, so the verdict travels with it. Stage B's output goes through three registers that
advance together with a two-register ICRC pipeline (the beat's lane controls, then the ICRC
word: the masked stream delayed by ``(-end) mod B`` bytes so that the ICRC ends a word), so the
ICRC is complete when the frame's last beat reaches the output; the opcode-dependent late
checks are made there too, from the decision. The output register has a skid register behind
it, so ``o.ready`` reaches only those two: the pipeline advances while the skid is empty.

Ports:
  ``i``       in   stream of beats (data, keep, last): Ethernet frames without FCS.
  ``o``       out  stream of beats: the payload of each RoCEv2 frame, re-aligned to lane 0, without
                   pad and ICRC; the whole frame, unchanged, for non-RoCE frames. Every frame
                   yields at least one beat (a frame without payload yields one beat with
                   ``keep == 0``), so every frame has a ``last`` beat to carry its verdict.
  ``o_meta``  out  the header record (``layout.record_layout()``, or the fields of it that
                   ``record_fields`` names: ``parser_record_layout``), valid while ``o.valid``
                   and ``o.payload.last``: every header field, ``roce``, ``payload_len``,
                   ``frame_len`` and the verdict ``drop`` / ``reason``.

Parameters: ``data_width`` (64 or 512 bits; any multiple of 64 up to 1024 works);
``record_fields`` (None: the whole record; else the names of the record fields ``o_meta``
carries, in that order: a consumer that reads few fields gets a parser without the others).

Latency (no stalls): fixed, ``ceil(128/B) + 6 + DECODE_STAGES`` cycles (B = data_width/8: 26
cycles at 64 bits, 12 at 512 bits; the ``latency`` attribute) from the input beat that holds the first byte
of an output beat to that output beat -- except the last output beat of a RoCEv2 frame, which
carries the verdict and so waits for the frame's last input beat (the ICRC): it leaves
``latency`` cycles after that one. So the first payload beat of a frame with an L-byte header
leaves ``latency + L // B`` cycles after the frame's first beat (unless it is also the last),
and every beat of a non-RoCE frame leaves ``latency`` cycles after it entered. (A frame shorter
than the window is decided at its last beat, so it can leave sooner.) Throughput: one beat per
clock, back-to-back frames without bubbles; backpressure on ``o`` stalls ``i`` without loss.

Verdicts (``DropReason``, one per frame; the first failing check in this order names it):
  1. MALFORMED    IPv4 ethertype with version != 4, IHL < 5 or total length < IHL * 4; IPv6
                  ethertype with version != 6; a frame shorter than its Ethernet (+VLAN)
                  header; an IP frame that ends inside its IP packet (truncated); for RoCEv2: bytes past
                  max(60, IP end) (not Ethernet padding), an IPv4 fragment, UDP length != IP
                  payload length, no room for BTH and ICRC.
  2. IP_CHECKSUM  bad IPv4 header checksum on a RoCEv2 frame.
  3. ICRC         bad ICRC (once it fails, no transport header bit can be trusted).
  4. MALFORMED    BTH TVer != 0.
  5. OPCODE       a BTH opcode that is not RC, UC, UD (IBTA) or CNP.
  6. MALFORMED    extension headers, pad and ICRC do not fit; payload + pad not a multiple of 4;
                  pad or payload on an opcode that carries none.
Non-RoCE frames (not IPv4/IPv6 UDP to port 4791) pass unchanged unless MALFORMED above.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from . import headers as H
from .crc import crc_step, materialize
from .icrc import icrc_capture, icrc_delayed_word, icrc_lane_ctrl
from .layout import MAX_FRAME_BITS, DropReason, beat_layout, lane, record_layout, unpack_header

__all__ = ["Parser", "HEADER_WINDOW", "LATE_FIELDS", "count_rx", "ipv4_words_sum",
           "ones_complement_fold", "parser_record_layout"]

HEADER_WINDOW = 128
assert H.MAX_HEADER_BYTES <= HEADER_WINDOW
# Candidate UDP header offsets: IPv4 at 14 or 18 with IHL 5..15, IPv6 at 14 or 18 (+40).
UDP_OFFSETS = sorted({ip + 4 * ihl for ip in (14, 18) for ihl in range(5, 16)} | {54, 58})
L4_WINDOW = H.UDP.size + H.BTH.size + 28   # UDP + BTH + the longest extension chain
DECODE_STAGES = 4   # registers between the header window and the decision FIFO
RECORD_STAGES = 2   # registers between the header window and the record FIFO
CSUM_PARTS = 8      # the IPv4 header's word sum, registered in D2 as this many partial sums
POS_BITS = 17   # absolute byte offsets: IPv4 total length (16 bits) + Ethernet/VLAN header


def tree_sum(values):
    """Sum of Values as a balanced adder tree (log2(n) adders deep, not a chain of n - 1)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def ones_complement_fold(total):
    """A raw sum of 16-bit words folded to 16 bits with end-around carry (RFC 1071; two folds
    suffice for a raw sum of up to 2^16 words)."""
    folded = total[:16] + total[16:]
    return (folded[:16] + folded[16:])[:16]


def _ipv4_words(ip_lanes, ihl):
    words = []
    for w in range(30):
        be = Cat(ip_lanes[w * 16 + 8:w * 16 + 16], ip_lanes[w * 16:w * 16 + 8])
        words.append(Mux(w < ihl * 2, be, 0) if w >= 10 else be)
    return words


def ipv4_words_sum(ip_lanes, ihl):
    """Raw (unfolded, 21-bit) sum of an IPv4 header's 16-bit words over its ``ihl`` words."""
    return tree_sum(_ipv4_words(ip_lanes, ihl))


def header_words_sums(lanes, groups):
    """The raw sums of ``groups`` runs of consecutive 16-bit words (network order) of ``lanes``:
    the IPv4 header's word sum when ``lanes`` hold the header and zeros around it."""
    words = [Cat(lanes[w * 16 + 8:w * 16 + 16], lanes[w * 16:w * 16 + 8])
             for w in range(len(lanes) // 16)]
    n = -(-len(words) // groups)
    return [tree_sum(words[i:i + n]) for i in range(0, len(words), n)]


def ext_extract(m, opcode, extv, name_prefix="ext", headers=H.EXT_HEADERS):
    """Each extension header's lanes (of ``headers``) from the extension-header vector, placed
    by opcode."""
    out = {}
    for h in headers:
        by_offset = {}
        for code in H.OPCODES:
            offs, _ = H.ext_layout(code)
            if h.name in offs:
                by_offset.setdefault(offs[h.name], []).append(code)
        sig = Signal(h.size * 8, name=f"{name_prefix}_{h.name}")
        with m.Switch(opcode):
            for off, codes in sorted(by_offset.items()):
                with m.Case(*codes):
                    m.d.comb += sig.eq(extv[off * 8:(off + h.size) * 8])
        out[h.name] = sig
    return out


def ext_length(m, opcode, name="ext_len"):
    """Total extension-header bytes of an opcode, and whether the opcode is known."""
    ext_len = Signal(range(64), name=name)
    known = Signal(name=f"{name}_known")
    has_payload = Signal(name=f"{name}_payload")
    with m.Switch(opcode):
        for code, op in H.OPCODES.items():
            with m.Case(code):
                m.d.comb += [ext_len.eq(H.ext_layout(code)[1]), known.eq(1),
                             has_payload.eq(op.payload)]
    return ext_len, known, has_payload


class Decision(data.Struct):
    raw: 1                       # pass the frame through unchanged
    ip: 1                        # an IPv4/IPv6 frame: it must not end inside its IP packet
    framing_bad: 1               # MALFORMED before anything else (frame length: stage B)
    csum_bad: 1                  # IPv4 header checksum (RoCEv2 frames)
    hlen: 7                      # header bytes before the payload (L)
    plen: MAX_FRAME_BITS         # payload bytes (P)
    end: POS_BITS                # absolute offset of the ICRC (E)
    ip_end: POS_BITS             # absolute offset just past the IP packet
    ip_off: 5                    # 14 or 18
    udp_off: 7
    ipv6: 1
    # the late checks' operands, checked in stage B with the frame's last beat
    pad: 2                       # BTH pad count
    op_known: 1
    op_payload: 1                # the opcode carries a payload
    tver_bad: 1                  # BTH TVer != 0
    plen_ovf: 1                  # payload length does not fit MAX_FRAME_BITS
    k: 6                         # (-end) mod B: the ICRC word alignment (stage B)
    pe: MAX_FRAME_BITS + 1       # plen + (hlen rounded down to a beat): payload end, realigned


# Record fields that come from stage B with a frame's last beat rather than from the record FIFO
LATE_FIELDS = ("payload_len", "frame_len", "drop", "reason")


def parser_record_layout(fields=None):
    """The layout of ``Parser.o_meta``: all of ``record_layout()`` (``fields`` None) or only the
    named fields of it, in the given order."""
    full = record_layout()
    if fields is None:
        return full
    unknown = [name for name in fields if name not in full.members]
    if unknown:
        raise KeyError(f"the header record has no field(s) {unknown}")
    return data.StructLayout({name: full[name].shape for name in fields})


class Parser(wiring.Component):
    def __init__(self, data_width=64, *, record_fields=None):
        assert data_width % 64 == 0
        self.record_fields = None if record_fields is None else tuple(record_fields)
        self.data_width = data_width
        self.nbytes = data_width // 8
        self.window_beats = -(-HEADER_WINDOW // self.nbytes)
        # beats of the Ethernet/VLAN header (bytes 0-17) and the IHL behind a VLAN tag (18)
        self.eth_beats = -(-19 // self.nbytes)
        self.latency = self.window_beats + 6 + DECODE_STAGES
        super().__init__({
            "i": In(stream.Signature(beat_layout(data_width))),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "o_meta": Out(parser_record_layout(self.record_fields)),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.nbytes
        NW = self.window_beats
        EW = self.eth_beats
        lg = (B - 1).bit_length()
        beat = beat_layout(self.data_width)
        out_l = parser_record_layout(self.record_fields)
        # The record FIFO holds the fields that are known when the header is decoded, but not the
        # extension headers' fields: their raw bytes (those after the BTH, as far as the fields
        # of ``o_meta`` reach) and the opcode, placed by opcode behind the FIFO. Headers share
        # bytes (RETH's and AtomicETH's VA and R_Key, at offset 0, are the same bytes; so are
        # AETH, IETH, DETH, ImmDt at offset 0), so 28 bytes hold all eight headers' 704 bits.
        ext_of = {f"{h.name}_{f.name}": (h, f) for h in H.EXT_HEADERS for f in h.fields}
        ext_fields = [name for name in out_l.members if name in ext_of]
        ext_heads = [h for h in H.EXT_HEADERS if any(ext_of[n][0] is h for n in ext_fields)]
        ext_bytes = max((off + -(-(f.first_bit + f.width) // 8)
                         for n in ext_fields for h, f in [ext_of[n]]
                         for code in H.OPCODES
                         for hn, off in H.ext_layout(code)[0].items() if hn == h.name),
                        default=0)
        queued = {name: f.shape for name, f in out_l
                  if name not in LATE_FIELDS and name not in ext_of}
        if ext_fields:
            queued.setdefault("bth_opcode", H.BTH.field("opcode").width)
            queued["ext_raw"] = ext_bytes * 8
        rec = data.StructLayout(queued)

        data_depth = 1 << (NW + 8 - 1).bit_length()
        rec_depth = 16     # LUT RAM is 16 deep: 16 entries cost what 8 did
        m.submodules.data_fifo = data_fifo = SyncFIFOBuffered(width=beat.size, depth=data_depth)
        dec_w = Decision.as_shape().size
        # each decision goes with the flags of its ``pe`` (see ``rem_flags`` in stage B)
        m.submodules.dec_fifo = dec_fifo = SyncFIFOBuffered(width=dec_w + B + 1, depth=rec_depth)
        m.submodules.rec_fifo = rec_fifo = SyncFIFOBuffered(width=max(1, rec.size),
                                                            depth=rec_depth)

        # ---------------------------------------------------------------- stage A: capture
        a_idx = Signal(range(NW + 1))
        # The capture registers need no reset (a frame's first beat writes or zeroes every byte),
        # which leaves the flip-flops' reset input to the zeroing (no mux in front of them).
        window = Signal(EW * B * 8, reset_less=True)   # the frame's first EW beats: Ethernet, VLAN
        decode = Signal()   # the frame's header (or the whole frame) has passed: decode it now
        keep_bits = Cat(*(self.i.payload.keep[b].replicate(8) for b in range(B)))
        in_data = self.i.payload.data & keep_bits   # AXI leaves null bytes undefined: zero them

        m.d.comb += [
            self.i.ready.eq(data_fifo.w_rdy
                            & (rec_fifo.w_level < rec_depth - 2 - RECORD_STAGES)),
            data_fifo.w_en.eq(self.i.valid & self.i.ready),
            data_fifo.w_data.eq(Cat(in_data, self.i.payload.keep, self.i.payload.last)),
        ]
        m.d.sync += decode.eq(0)
        # The window takes the offered beat whether or not it is accepted (not gated by
        # ``ready``, which is off the window's clock enables): until it is accepted, ``a_idx``
        # stays and the same beat is offered again, and a not-yet-accepted first beat of the next
        # frame overwrites only a window that D1 has already copied.
        with m.If(self.i.valid):
            with m.Switch(a_idx):
                with m.Case(0):
                    m.d.sync += window.eq(in_data)    # zeroes the rest: short frames read 0
                for n in range(1, EW):
                    with m.Case(n):
                        m.d.sync += window[n * B * 8:(n + 1) * B * 8].eq(in_data)
        a_acc = Signal()
        m.d.comb += a_acc.eq(self.i.valid & self.i.ready)
        with m.If(a_acc):
            with m.If(self.i.payload.last):
                m.d.sync += a_idx.eq(0)
            with m.Elif(a_idx < NW):
                m.d.sync += a_idx.eq(a_idx + 1)
            m.d.sync += decode.eq((a_idx < NW) & ((a_idx == NW - 1) | self.i.payload.last))

        # The IP header window (the 64 bytes from offset 14) and the L4 window (UDP, BTH and the
        # extension headers) are not cut out of a window of the whole header by a mux on their
        # offset (12 positions for the L4 window: ~8 LUTs a bit): they are captured from the
        # accepted beats as they pass, each byte from the beat and lane where the frame's offsets
        # put it. The beat is selected by the flip-flops' enables, so a byte is a mux of only the
        # lanes its candidate offsets fall in (2 at 64 bits). a1 and a2 are the beats accepted
        # one and two clocks ago. When a1 holds beat n, the window holds this frame's beats
        # 0..n (the next frame can overwrite it a clock later at the earliest), and every IP
        # header byte lies in a beat at or after the one with the EtherType (bytes 12-13), every
        # L4 byte in one at or after byte 18 (the IHL behind a VLAN tag): the offsets are read
        # from the window when they are needed. A frame's first beat zeroes the bytes it does
        # not hold (a short frame reads 0 past its end, as the window does). The IP window is
        # complete a clock after the frame's last header beat (for D2), the L4 window two
        # clocks after (for D3, in place of a D2 register); the next frame's first beat reaches
        # them a clock later than that at the earliest.
        a1_data, a2_data = Signal(B * 8, reset_less=True), Signal(B * 8, reset_less=True)
        a1_idx, a2_idx = Signal(range(NW + 1)), Signal(range(NW + 1))
        a1_valid, a2_valid = Signal(), Signal()
        m.d.sync += [a1_valid.eq(a_acc), a2_valid.eq(a1_valid)]
        with m.If(a_acc):
            m.d.sync += [a1_data.eq(in_data), a1_idx.eq(a_idx)]
        with m.If(a1_valid):
            m.d.sync += [a2_data.eq(a1_data), a2_idx.eq(a1_idx)]

        def capture(nbytes, valid, idx, beat_data, sel_next, offsets, name, keep=None):
            """A register of ``nbytes`` bytes whose byte j is taken from ``beat_data`` when
            ``valid`` and the beat index ``idx`` is the one that holds absolute byte
            ``offsets[sel] + j``, from that byte's lane, and zeroed on a frame's first beat
            otherwise. ``sel`` is ``sel_next`` of the clock before (the caller registers it
            every clock). The lane is picked by the offset's phase (``offsets[sel]`` mod B),
            one of at most B / 4 values for offsets 4 bytes apart; the beat by the enables.
            ``keep(j)`` (if given): byte j is taken as zero unless it is 1 (a flip-flop reset,
            no mux).

            With several offsets, the offset's first beat (``base``) and phase are registered
            from ``sel_next``, and byte j's beat is ``base`` + (phase + j) // B: every byte
            compares the one difference ``idx - base`` with a constant per phase, instead of
            decoding ``sel`` for itself (from the L4 position through each byte's decode to
            its reset it was 7 LUT levels, 11.1 ns routed on the ECPIX-5 core at 2c5ea0a)."""
            phases = sorted({off % B for off in offsets.values()})
            reg = Signal(nbytes * 8, name=name, reset_less=True)
            first = idx == 0
            if len(offsets) > 1:
                phase = Signal(range(len(phases)), name=f"{name}_phase")
                base = Signal.like(idx, name=f"{name}_base")
                sel_ok = Signal(name=f"{name}_sel_ok")
                m.d.sync += sel_ok.eq(0)
                with m.Switch(sel_next):
                    for v, off in offsets.items():
                        with m.Case(v):
                            m.d.sync += [phase.eq(phases.index(off % B)), base.eq(off // B),
                                         sel_ok.eq(1)]
                rel = Signal.like(idx, name=f"{name}_rel")
                m.d.comb += rel.eq(idx - base)
            else:
                phase = Const(0, 1)
            for j in range(nbytes):
                hit = Signal(name=f"{name}_hit{j}")
                if len(offsets) == 1:
                    m.d.comb += hit.eq(idx == (next(iter(offsets.values())) + j) // B)
                else:
                    with m.Switch(phase):
                        for k, ph in enumerate(phases):
                            with m.Case(k):
                                m.d.comb += hit.eq(sel_ok & (rel == (ph + j) // B))
                val = Signal(8, name=f"{name}_val{j}")
                with m.Switch(phase):
                    for s, ph in enumerate(phases):
                        with m.Case(s):
                            m.d.comb += val.eq(lane(beat_data, (ph + j) % B))
                kept = 1 if keep is None else keep(j)
                with m.If(valid):
                    with m.If(hit & kept):
                        m.d.sync += reg[j * 8:(j + 1) * 8].eq(val)
                    with m.Elif(first | hit):
                        m.d.sync += reg[j * 8:(j + 1) * 8].eq(0)
            return reg

        eth_c = unpack_header(H.ETH, window[:H.ETH.size * 8])
        vlan_c = unpack_header(H.VLAN, window[14 * 8:18 * 8])
        vlan_p_c = eth_c["ethertype"] == H.ETHERTYPE_VLAN
        ihl14 = window[14 * 8:14 * 8 + 4]     # the IHL: the low nibble of the IP header's byte 0
        ihl18 = window[18 * 8:18 * 8 + 4]
        # The IP header window: the 64 bytes from offset 14, so that it holds the IP header with
        # or without a VLAN tag in fixed lanes (no mux; D2 undoes the tag's 4 bytes on the bits
        # it reads). Of an IPv4 frame it keeps only the header (its first 20 bytes and its
        # options, IHL words; a VLAN tag's bytes are zero), so that the header checksum is the
        # plain sum of the window's words, without a mask per word.
        is4_14 = eth_c["ethertype"] == H.ETHERTYPE_IPV4
        is4_18 = vlan_c["ethertype"] == H.ETHERTYPE_IPV4
        # The same, registered every clock: a clock old, they are this frame's for a byte whose
        # beat comes after the one with byte 18 (at 64 bits, every byte from offset 24 on), which
        # takes the EtherType and IHL decode off the capture's reset path for those bytes
        hdr_now = Cat(vlan_p_c, is4_14, is4_18, ihl14, ihl18)
        hdr_reg = Signal.like(hdr_now, name="ipraw_hdr")
        m.d.sync += hdr_reg.eq(hdr_now)

        def ip_keep(j):
            # the EtherType and the IHL precede byte j: read them from the window as it passes
            if j < 4:
                return ~vlan_p_c
            hdr = hdr_reg if (14 + j) // B > 18 // B else hdr_now
            vlan, v4_14, v4_18, i14, i18 = hdr[0], hdr[1], hdr[2], hdr[3:7], hdr[7:11]
            in14 = ~v4_14 | (j // 4 < 5) | (j // 4 < i14)
            in18 = ~v4_18 | ((j - 4) // 4 < 5) | ((j - 4) // 4 < i18)
            return Mux(vlan, in18, in14)
        ipraw = capture(64, a1_valid, a1_idx, a1_data, None, {0: 14}, "ipraw", keep=ip_keep)
        # l4_pos: the UDP header's offset is 14 + 4 * l4_pos (l4_pos = VLAN + 10 for IPv6, VLAN +
        # IHL else), each alignment decoded straight from the window bytes; registered every
        # clock, so that it is at hand for the L4 capture and holds the decoded frame's in D2
        l4_pos_c = Mux(vlan_p_c,
                       Mux(vlan_c["ethertype"] == H.ETHERTYPE_IPV6, 11, ihl18 + 1),
                       Mux(eth_c["ethertype"] == H.ETHERTYPE_IPV6, 10, ihl14))
        l4_pos = Signal(5)
        m.d.sync += l4_pos.eq(l4_pos_c)
        l4 = capture(L4_WINDOW, a2_valid, a2_idx, a2_data, l4_pos_c,
                     {(off - 14) // 4: off for off in UDP_OFFSETS}, "l4")

        # ---------------------------------------------------------------- decoder
        # Five clocks from ``decode`` to the decision FIFO write (DECODE_STAGES), three to the
        # record FIFO's (RECORD_STAGES), so that no clock holds more than one step of the header
        # arithmetic (in one clock, window -> EtherType -> IP offset -> options -> checksum / UDP
        # offset -> opcode -> lengths -> checks was 45 logic levels, 19.8 ns on an ECP5 at
        # speed 8):
        #   D1  the Ethernet/VLAN bytes of the window are copied (the next frame overwrites it
        #       from the next clock) with the EtherType decode; the IP header window is captured
        #       and the L4 window's position (l4_pos) registered in the same clock;
        #   D2  IP offset, IPv4/IPv6 fields, the UDP offset, the IPv4 header's word sum as eight
        #       partial sums, the IP lengths; the Ethernet/VLAN bytes and the IP header window go
        #       on; the L4 window is captured in the same clock;
        #   D3  the opcode's decode (extension-header length, known, payload), the record
        #       (written to its FIFO at the end of this clock), the RoCE framing checks, the
        #       IPv4 word sum, the lengths without the extension headers;
        #   D4  header and payload lengths, the IPv4 checksum's fold and the decision (written to
        #       its FIFO the next clock; the late checks -- TVer, opcode, opcode lengths -- are
        #       made in stage B from the decision's operands).

        # D1
        ethertype_c = Mux(vlan_p_c, vlan_c["ethertype"], eth_c["ethertype"])
        d1_valid = Signal()
        d1_eth = Signal(18 * 8)       # Ethernet and VLAN header bytes
        vlan_p, is4, is6 = Signal(name="vlan_p"), Signal(name="is4"), Signal(name="is6")
        m.d.sync += d1_valid.eq(decode)
        with m.If(decode):
            m.d.sync += [d1_eth.eq(window[:18 * 8]), vlan_p.eq(vlan_p_c),
                         is4.eq(ethertype_c == H.ETHERTYPE_IPV4),
                         is6.eq(ethertype_c == H.ETHERTYPE_IPV6)]

        # D2
        d1_ipwin = Mux(vlan_p, ipraw[4 * 8:64 * 8], ipraw[:60 * 8])
        ip_off_c = Mux(vlan_p, 18, 14)
        ip4_c = unpack_header(H.IPV4, d1_ipwin[:160])
        ip6_c = unpack_header(H.IPV6, d1_ipwin[:320])
        ihl_c = ip4_c["ihl"]
        udp_off_c = Signal(7)     # ip_off + 40 for IPv6, ip_off + 4 * IHL else
        m.d.comb += udp_off_c.eq(14 + l4_pos * 4)
        ip_len_c = Signal(POS_BITS)
        m.d.comb += ip_len_c.eq(Mux(is6, 40 + ip6_c["payload_length"], ip4_c["total_length"]))
        d2_valid = Signal()
        d2_eth = Signal(18 * 8)       # Ethernet and VLAN header bytes
        d2_ipwin = Signal(60 * 8)     # the IP header window
        d2_vlan_p, d2_is4, d2_is6 = Signal(), Signal(), Signal()
        udp_off = Signal(7)
        ip_len = Signal(POS_BITS)
        ip_end = Signal(POS_BITS)
        v4_bad, v6_bad = Signal(name="v4_bad"), Signal(name="v6_bad")
        csum_parts = [Signal(21, name=f"csum_part{i}") for i in range(CSUM_PARTS)]
        m.d.sync += d2_valid.eq(d1_valid)
        with m.If(d1_valid):
            m.d.sync += [
                d2_eth.eq(d1_eth), d2_ipwin.eq(d1_ipwin),
                d2_vlan_p.eq(vlan_p), d2_is4.eq(is4), d2_is6.eq(is6),
                udp_off.eq(udp_off_c), ip_len.eq(ip_len_c),
                ip_end.eq(ip_off_c + ip_len_c),
                v4_bad.eq(is4 & ((ip4_c["version"] != 4) | (ihl_c < 5)
                                 | (ip4_c["total_length"] < ihl_c * 4))),
                v6_bad.eq(is6 & (ip6_c["version"] != 6)),
                *(p.eq(v) for p, v in zip(csum_parts, header_words_sums(ipraw, CSUM_PARTS),
                                          strict=True)),
            ]

        # D3
        is4, is6, vlan_p = d2_is4, d2_is6, d2_vlan_p
        eth = unpack_header(H.ETH, d2_eth[:H.ETH.size * 8])
        vlan = unpack_header(H.VLAN, d2_eth[14 * 8:18 * 8])
        ip_off = Mux(vlan_p, 18, 14)
        ipwin = d2_ipwin
        ip4 = unpack_header(H.IPV4, ipwin[:160])
        ip6 = unpack_header(H.IPV6, ipwin[:320])
        ihl = ip4["ihl"]
        options = Cat(*(Mux(i < (ihl - 5) * 4, ipwin[160 + 8 * i:168 + 8 * i], 0)
                        for i in range(H.MAX_IPV4_OPTIONS)))
        udp = unpack_header(H.UDP, l4[:64])
        bth = unpack_header(H.BTH, l4[64:160])
        ext_len_c, op_known_c, op_payload_c = ext_length(m, bth["opcode"])

        frag = (ip4["frag_offset"] != 0) | ip4["flags"][0]   # flags: reserved, DF, MF (bit 0)
        udp_is = Mux(is6, ~v6_bad & (ip6["next_header"] == H.IPPROTO_UDP),
                     is4 & ~v4_bad & (ip4["protocol"] == H.IPPROTO_UDP) & (ip4["frag_offset"] == 0))
        roce_c = materialize(m, (is4 | is6) & udp_is & (udp["dport"] == H.ROCEV2_UDP_PORT), "roce")
        pad_c = bth["pad_count"]
        # Checks in the order that names a frame's verdict (sim/packets.py documents the same
        # order for the golden model): framing first, since without it nothing can be located;
        # then the IPv4 checksum; then the ICRC (stage B), which outranks every BTH-level fault
        # because once it fails no transport header bit can be trusted; then TVer, the opcode
        # and the opcode-dependent lengths. D3 makes the RoCE-only framing checks (udp_off -
        # ip_off is 40 or 4 * IHL) and the IPv4 word sum; D4 combines them.
        roce_framing_c = ((is4 & frag)
                          | (udp["length"] != ip_len - Mux(is6, 40, ihl * 4))
                          | (ip_end < udp_off + (H.UDP.size + H.BTH.size + 4)))  # BTH + ICRC
        # The record carries only the fields of ``o_meta`` (all of them unless ``record_fields``
        # names fewer); payload_len comes from the decision, with the frame's last beat
        record_c = Signal(rec)
        parsed = {"eth": eth, "vlan": vlan, "ipv4": ip4, "ipv6": ip6, "udp": udp, "bth": bth}
        values = {f"{hname}_{fname}": value for hname, fields in parsed.items()
                  for fname, value in fields.items()}
        values.update(vlan=vlan_p, ipv6=is6, roce=roce_c, ext_raw=l4[160:160 + ext_bytes * 8])
        for name in rec.members:
            m.d.comb += record_c[name].eq(options if name == "ipv4_options" else values[name])
        d3_valid = Signal()
        ext_len = Signal(range(64), name="d3_ext_len")
        op_known, op_payload = Signal(name="d3_op_known"), Signal(name="d3_op_payload")
        hbase = Signal(8, name="d3_hbase")              # udp_off + UDP + BTH: hlen - ext_len
        pbase = Signal(POS_BITS + 1, name="d3_pbase")   # ip_end - (pad + 4) - hbase: plen + ext_len
        roce, roce_framing = Signal(name="d3_roce"), Signal(name="d3_roce_framing")
        ip_bad = Signal(name="d3_ip_bad")
        csum_sum = Signal(21, name="d3_csum_sum")
        d3_is4 = Signal()
        d3 = Signal(Decision)   # the fields that need no more arithmetic
        m.d.sync += d3_valid.eq(d2_valid)
        with m.If(d2_valid):
            m.d.sync += [
                ext_len.eq(ext_len_c), op_known.eq(op_known_c), op_payload.eq(op_payload_c),
                hbase.eq(udp_off + (H.UDP.size + H.BTH.size)),
                pbase.eq((ip_end - (pad_c + 4)) - (udp_off + (H.UDP.size + H.BTH.size))),
                roce.eq(roce_c), roce_framing.eq(roce_framing_c),
                ip_bad.eq(v4_bad | v6_bad),
                csum_sum.eq(tree_sum(csum_parts)),
                d3.ip.eq((is4 & ~v4_bad) | (is6 & ~v6_bad)),
                d3.pad.eq(pad_c),
                d3.tver_bad.eq(bth["tver"] != 0),
                d3.k.eq((4 - ip_end)[:lg] if lg else 0),    # (-end) mod B, end = ip_end - 4
                d3.end.eq(ip_end - 4),
                d3.ip_end.eq(ip_end),
                d3.ip_off.eq(ip_off),
                d3.udp_off.eq(udp_off),
                d3.ipv6.eq(is6),
                d3_is4.eq(is4),
            ]
        m.d.comb += [
            rec_fifo.w_en.eq(d2_valid),      # the record goes into its FIFO at the end of D3
            rec_fifo.w_data.eq(record_c),
        ]

        # D4: the opcode's extension-header length into the header and payload lengths
        hlen = Signal(8)
        m.d.comb += hlen.eq(hbase + ext_len)
        plen_wide = Signal(POS_BITS + 1)
        m.d.comb += plen_wide.eq(pbase - ext_len)
        dec_c = Signal(Decision)
        m.d.comb += [
            dec_c.eq(d3),
            dec_c.raw.eq(~roce),
            dec_c.framing_bad.eq(ip_bad | (roce & roce_framing)),
            dec_c.csum_bad.eq(roce & d3_is4 & (ones_complement_fold(csum_sum) != 0xFFFF)),
            dec_c.op_known.eq(op_known),
            dec_c.op_payload.eq(op_payload),
            dec_c.plen_ovf.eq(plen_wide >= (1 << MAX_FRAME_BITS)),
            dec_c.hlen.eq(Mux(roce, hlen, 0)),
            dec_c.plen.eq(plen_wide),
        ]
        # pe: plen + the first payload beat's offset, so that stage B's remaining payload at a
        # beat is pe - the beat's offset (one subtraction)
        m.d.comb += dec_c.pe.eq(dec_c.plen + Cat(Const(0, lg), dec_c.hlen[lg:]))
        d4_valid = Signal()
        dec = Signal(Decision)
        m.d.sync += d4_valid.eq(d3_valid)
        with m.If(d3_valid):
            m.d.sync += dec.eq(dec_c)

        def rem_flags(rem, ahead=0):
            """Stage B's flags of a remaining payload count ``rem - ahead``: for each lane b
            whether the count is > b (the beat's keep), and whether it is <= B (the frame's
            last payload beat)."""
            return Cat(*(rem > ahead + b for b in range(B)), rem <= ahead + B)

        m.d.comb += [
            dec_fifo.w_en.eq(d4_valid),
            dec_fifo.w_data.eq(Cat(dec, rem_flags(dec.pe))),
        ]

        # ---------------------------------------------------------------- stage B: stream
        d = Decision(dec_fifo.r_data[:dec_w])
        cur = Signal(beat)
        cur_valid = Signal()
        nxt = beat(data_fifo.r_data)
        b_idx = Signal(range(1 << (POS_BITS - lg)))
        base = Signal(POS_BITS)
        m.d.comb += base.eq(b_idx * B)
        crc = Signal(32)
        icrc_rx = Signal(32)
        fin = Signal(beat)
        fin_valid = Signal()

        # Output pipeline: three registers (o1, o2, o3), advancing together with the ICRC
        # pipeline whenever the output is free, so that the CRC register holds a frame's whole
        # ICRC when that frame's last beat is in o3. Each carries the beat and, on a frame's
        # last beat, the verdict's operands.
        ol = data.StructLayout({
            "beat": beat, "icrc": 32, "framing": 1, "csum": 1, "late": DropReason, "check": 1,
            "frame_len": MAX_FRAME_BITS, "payload_len": MAX_FRAME_BITS,
        })
        o1, o2, o3 = Signal(ol), Signal(ol), Signal(ol)
        o1_valid, o2_valid, o3_valid = Signal(), Signal(), Signal()
        # o4: the beat again, with the verdict registered (computed from o3 and the CRC
        # register as the beat leaves o3): what the consumer commits or drops a frame on then
        # starts at flip-flops (from the CRC register through the ICRC compare and the verdict
        # into the receive buffer's and the record queues' commit it was 11.6 ns routed on the
        # ECPIX-5 core at 2c5ea0a).
        o4 = Signal(data.StructLayout({"beat": beat, "frame_len": MAX_FRAME_BITS,
                                       "payload_len": MAX_FRAME_BITS, "reason": DropReason}))
        o4_valid = Signal()
        # o5: a skid register behind o4, so that the pipeline advances on a flip-flop of its
        # own (``adv`` is "the skid is empty") and not on the consumer's ``ready``: that came
        # from the receive flow's queue room, across the die, into the clock enables of every
        # stage here and into the CRC register's logic (251 failing endpoints, -2.77 ns routed
        # on the ECPIX-5 core at ec958a5). While the consumer stalls, the beat leaving o3 waits
        # in o5 and o4 takes it when its own beat is taken; then the pipeline moves again.
        o5 = Signal.like(o4)
        o5_valid = Signal()
        adv = ~o5_valid

        proc = cur_valid & dec_fifo.r_rdy & (cur.last | data_fifo.r_rdy) & adv
        load = (proc | ~cur_valid) & data_fifo.r_rdy
        m.d.comb += data_fifo.r_en.eq(load)
        with m.If(load):
            m.d.sync += [cur.eq(nxt), cur_valid.eq(1)]
        with m.Elif(proc):
            m.d.sync += cur_valid.eq(0)

        # Payload re-alignment: output beat k holds bytes [L + kB, L + (k+1)B) of the frame.
        shift = d.hlen[:lg] if lg else Const(0, 1)
        first_beat = d.hlen[lg:] if lg else d.hlen
        # remaining = plen - (b_idx - first_beat) * B = pe - base (pe = plen + first_beat * B from
        # the decoder): pe itself at a frame's first beat (b_idx == 0), then a register that
        # counts down by B with every beat processed (no subtraction on the path to the output).
        remaining = Signal(range(-(1 << POS_BITS), 1 << POS_BITS))
        rem_next = Signal.like(remaining)
        b_first = Signal(init=1)    # b_idx == 0
        m.d.comb += remaining.eq(Mux(b_first, d.pe, rem_next))
        # The compares of ``remaining`` that choose the beat's keep and whether it is the last
        # payload beat come from flip-flops: the decision's, written with it into the FIFO, at
        # a frame's first beat, then registered a beat ahead. Made on ``remaining`` itself they
        # were a carry chain behind its multiplexer into the held beat (-2.61 ns routed on the
        # ECPIX-5 core at ec958a5).
        r_flags = Signal(B + 1)
        flags = Signal(B + 1)
        m.d.comb += flags.eq(Mux(b_first, dec_fifo.r_data[dec_w:], r_flags))
        shifted = materialize(
            m, Cat(cur.data, nxt.data).bit_select(shift * 8, B * 8) if lg else cur.data, "shifted")
        cand_keep = Signal(B)
        m.d.comb += cand_keep.eq(flags[:B])
        cand_emit = materialize(m, (b_idx >= first_beat) & flags[0], "cand_emit")
        cand_final = materialize(m, flags[B], "cand_final")

        # ICRC: the data-independent lane controls come with each beat into c2; c3 holds the
        # ICRC word, the masked stream delayed by k = (-end) mod B bytes so that the ICRC's
        # last byte ends a word (the init-0 CRC ignores the zero bytes this puts in front); the
        # CRC register takes c3's word as the beat's output, if any, enters o3. The received
        # ICRC is captured as it passes.
        zero, ff, nib = icrc_lane_ctrl(m, base, d.ip_off, d.udp_off, d.ipv6, d.end, B,
                                       name="rx_icrc")
        cl = data.StructLayout({"data": self.data_width, "zero": B, "ff": B, "nib": B,
                                "first": 1, "update": 1, "k": 6})
        c2, c3 = Signal(cl), Signal(cl)
        c2_valid, c3_valid = Signal(), Signal()
        c3_word = Signal(self.data_width)
        prev_masked = Signal(self.data_width)
        with m.If(adv):
            m.d.sync += [c2_valid.eq(proc), c3_valid.eq(c2_valid)]
        with m.If(proc):
            m.d.sync += [
                c2.data.eq(cur.data), c2.zero.eq(zero), c2.ff.eq(ff), c2.nib.eq(nib),
                c2.first.eq(b_idx == 0), c2.update.eq(base < d.end), c2.k.eq(d.k),
            ]
        masked, word = icrc_delayed_word(m, c2.data, c2.zero, c2.ff, c2.nib, c2.first, c2.k,
                                         prev_masked, B, "rx_icrc")
        with m.If(adv & c2_valid):
            m.d.sync += [c3.eq(c2), c3_word.eq(word), prev_masked.eq(masked)]
        with m.If(adv & c3_valid & c3.update):
            m.d.sync += crc.eq(crc_step(m, Mux(c3.first, 0, crc), c3_word, name="rx_icrc_crc"))
        cap_eq, icrc_next = icrc_capture(icrc_rx, cur.data, base, d.end, B)
        m.d.comb += cap_eq
        frame_len = Signal(POS_BITS)
        m.d.comb += frame_len.eq(base + sum(cur.keep[b] for b in range(B)))
        too_long = frame_len > Mux(d.ip_end > 60, d.ip_end, 60)
        len_err = ((frame_len < d.ip_off)                  # shorter than its Ethernet header
                   | (d.ip & (frame_len < d.ip_end)) | (~d.raw & too_long))
        transport_bad = (
            (d.ip_end < d.hlen + d.pad + 4)                       # ext headers + pad + ICRC
            | (d.op_known & ((d.end - d.hlen)[:2] != 0))          # payload + pad not 4-aligned
            | d.plen_ovf
            | (d.op_known & ~d.op_payload & ((d.pad != 0) | (d.end != d.hlen))))
        late = Signal(DropReason)
        with m.If(d.raw):
            m.d.comb += late.eq(DropReason.NONE)
        with m.Elif(d.tver_bad):
            m.d.comb += late.eq(DropReason.MALFORMED)
        with m.Elif(~d.op_known):
            m.d.comb += late.eq(DropReason.OPCODE)
        with m.Elif(transport_bad):
            m.d.comb += late.eq(DropReason.MALFORMED)

        # The output beat: the shifted beat (a raw frame's is not shifted: its hlen is 0) or the
        # held last payload beat, its bytes outside ``keep`` zeroed -- one mux for the data, the
        # choice of the frame kind and of the beat made on the 8 keep bits alone.
        emit = Signal()
        out = Signal(beat)
        use_fin = Signal()
        with m.If(d.raw):
            m.d.comb += [emit.eq(1), out.keep.eq(cur.keep)]
        with m.Elif(cur.last):
            m.d.comb += emit.eq(1)
            with m.If(fin_valid):
                m.d.comb += [use_fin.eq(1), out.keep.eq(fin.keep)]
            with m.Elif(cand_emit):
                m.d.comb += out.keep.eq(cand_keep)
        with m.Elif(cand_emit & ~cand_final):
            m.d.comb += [emit.eq(1), out.keep.eq(cand_keep)]
        m.d.comb += [
            out.last.eq(cur.last),
            out.data.eq(Mux(use_fin, fin.data, shifted)
                        & Cat(*(out.keep[b].replicate(8) for b in range(B)))),
        ]

        with m.If(proc):
            m.d.sync += [icrc_rx.eq(icrc_next), rem_next.eq(remaining - B),
                         r_flags.eq(rem_flags(remaining, B))]
            with m.If(cur.last):
                m.d.sync += [b_idx.eq(0), b_first.eq(1), fin_valid.eq(0)]
            with m.Else():
                m.d.sync += [b_idx.eq(b_idx + 1), b_first.eq(0)]
                with m.If(~d.raw & cand_emit & cand_final):
                    m.d.sync += [fin.data.eq(shifted), fin.keep.eq(cand_keep), fin_valid.eq(1)]
        m.d.comb += dec_fifo.r_en.eq(proc & cur.last)

        with m.If(adv):
            m.d.sync += [o1_valid.eq(proc & emit), o2_valid.eq(o1_valid), o3_valid.eq(o2_valid)]
        with m.If(proc & emit):
            m.d.sync += o1.beat.eq(out)
            with m.If(cur.last):
                m.d.sync += [
                    o1.icrc.eq(icrc_next),
                    o1.framing.eq(d.framing_bad | len_err),
                    o1.csum.eq(d.csum_bad),
                    o1.late.eq(late),
                    o1.check.eq(~d.raw),
                    o1.frame_len.eq(frame_len),
                    o1.payload_len.eq(Mux(d.raw, 0, d.plen)),
                ]
        with m.If(adv & o1_valid):
            m.d.sync += o2.eq(o1)
        with m.If(adv & o2_valid):
            m.d.sync += o3.eq(o2)

        # ---------------------------------------------------------------- output and verdict
        icrc_bad = (crc ^ 0xFFFFFFFF) != o3.icrc
        verdict = Signal(DropReason)
        with m.If(o3.framing):
            m.d.comb += verdict.eq(DropReason.MALFORMED)
        with m.Elif(o3.csum):
            m.d.comb += verdict.eq(DropReason.IP_CHECKSUM)
        with m.Elif(o3.check & icrc_bad):
            m.d.comb += verdict.eq(DropReason.ICRC)
        with m.Else():
            m.d.comb += verdict.eq(o3.late)
        o3_out = Signal.like(o4)
        m.d.comb += [o3_out.beat.eq(o3.beat), o3_out.frame_len.eq(o3.frame_len),
                     o3_out.payload_len.eq(o3.payload_len), o3_out.reason.eq(verdict)]
        # The record FIFO's head is popped a clock after the frame's last beat has left (from
        # a flip-flop, not from the consumer's ``ready``: its output register's enables were
        # 100 of the endpoints above). Until the next head is out, a last beat waits in o4.
        pop = Signal()
        take = Signal()
        m.d.comb += [
            self.o.valid.eq(o4_valid & ~(pop & o4.beat.last)),
            take.eq(self.o.valid & self.o.ready),
            rec_fifo.r_en.eq(pop),
        ]
        m.d.sync += pop.eq(take & o4.beat.last)
        o3_go = adv & o3_valid     # o3's beat moves on (into o4, or o5 when o4 stays)
        with m.If(~o4_valid | take):
            m.d.sync += o4_valid.eq(o5_valid | o3_go)
            with m.If(o5_valid):
                m.d.sync += [o4.eq(o5), o5_valid.eq(0)]
            with m.Elif(o3_go):
                m.d.sync += o4.eq(o3_out)
        with m.Elif(o3_go):
            m.d.sync += [o5.eq(o3_out), o5_valid.eq(1)]
        late_fields = {"frame_len": o4.frame_len, "payload_len": o4.payload_len,
                       "drop": o4.reason != DropReason.NONE, "reason": o4.reason}
        # the record at the FIFO's head, the extension headers placed by opcode
        q = rec(rec_fifo.r_data)
        head = {name: q[name] for name in rec.members if name != "ext_raw"}
        if ext_fields:
            extv = Cat(q.ext_raw, Const(0, (L4_WINDOW - 20) * 8 - ext_bytes * 8))
            for hname, lanes in ext_extract(m, q.bth_opcode, extv, "ext_out", ext_heads).items():
                h = next(h for h in ext_heads if h.name == hname)
                head.update({f"{hname}_{fname}": v
                             for fname, v in unpack_header(h, lanes).items()})
        m.d.comb += [
            self.o.payload.eq(o4.beat),
            *(self.o_meta[name].eq(head[name]) for name in out_l.members if name in head),
            *(self.o_meta[name].eq(late_fields[name]) for name in LATE_FIELDS
              if name in out_l.members),
        ]
        return m


def count_rx(m, pe, meta, last, overflow):
    """Drive the receive counters of the ``pktengine`` register block (``pe``: its CSR ports)
    from the parser's record ``meta``, ``last`` (a frame's last beat leaves the parser this clock)
    and ``overflow`` (that frame did not fit the receive buffer). Shared by every top that puts a
    receive buffer behind the parser; ``config`` and ``tx_frames_inc`` stay with the top."""
    ecn = Signal(2)
    m.d.comb += ecn.eq(Mux(meta.ipv6, meta.ipv6_ecn, meta.ipv4_ecn))
    dropped = meta.drop | overflow
    m.d.comb += [
        pe.rx_frames_inc.eq(last),
        pe.rx_roce_inc.eq(last & meta.roce),
        pe.rx_non_roce_inc.eq(last & ~meta.roce),
        pe.rx_ecn_ce_inc.eq(last & meta.roce & ~dropped & (ecn == 3)),
        pe.rx_drop_icrc_inc.eq(last & (meta.reason == DropReason.ICRC)),
        pe.rx_drop_ip_checksum_inc.eq(last & (meta.reason == DropReason.IP_CHECKSUM)),
        pe.rx_drop_malformed_inc.eq(last & (meta.reason == DropReason.MALFORMED)),
        pe.rx_drop_opcode_inc.eq(last & (meta.reason == DropReason.OPCODE)),
        pe.rx_drop_overflow_inc.eq(last & ~meta.drop & overflow),
    ]
