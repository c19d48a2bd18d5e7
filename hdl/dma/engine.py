# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part A (AXI4): A3.3 (channel
#      dependencies), A3.4.1 (INCR bursts: at most 256 beats, never across 4 KiB), A3.4.3 (write
#      strobes), A3.4.4 (unaligned transfers), A5.3 (transactions of one ID complete in order)
"""AXI4 DMA engine: byte-addressed writes and reads of host memory for the RC transport.

Both directions take commands ``{addr: 64, len: 16}`` (``len`` bytes at byte address ``addr``,
any alignment) and move the bytes as lane-0 aligned stream beats (``beat_layout(W)``:
``max(1, ceil(len / B))`` beats per command, ``B = W / 8`` bytes each, byte 0 in lane 0). On the
bus every transfer is full width (``AxSIZE = log2(B)``), bursts are INCR, never cross a 4 KiB
boundary and have at most ``max_burst`` beats; a burst may start at an unaligned address (its
first beat then has ``WSTRB`` / useful ``RDATA`` lanes from the address offset up).

Structure::

    cmd -> BurstSplitter --+--> AW register ----------------------------------> aw
                           +--> W descriptors --> realign (byte shifter) ------> w
                           +--> B tracking (one entry per burst) <-------------- b  --> done
    cmd -> BurstSplitter --+--> AR register (credits: buffer space, bursts) ---> ar
                           +--> R descriptors --> realign <-- R buffer <-------- r  --> o

The :class:`BurstSplitter` turns one command into its bursts, one per clock. Every burst uses
ID 0, so the subordinate returns write responses and read data in issue order (A5.3) and the
engine needs no reorder buffer: it counts B responses per command for ``done``, and it knows
which command each R beat belongs to from the order of its descriptors.

A command of length 0 makes no bus transfer; it still takes its one ``keep == 0`` beat
(writer) or emits one ``keep == 0, last`` beat (reader), and the writer pulses ``done`` for it
in order.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..net.layout import beat_layout
from ..skid import SkidBuffer
from .axi4 import BOUNDARY, CACHE_NORMAL, PROT_DATA, Axi4Signature, Burst, Resp

__all__ = ["cmd_layout", "done_layout", "burst_layout", "BurstSplitter", "DmaWriter",
           "DmaReader", "Dma", "connect_axi"]

LEN_BITS = 16
ADDR_BITS = 64
COUNTER_BITS = 16


def cmd_layout():
    """A DMA command: ``len`` bytes at byte address ``addr``."""
    return data.StructLayout({"addr": ADDR_BITS, "len": LEN_BITS})


def done_layout():
    """Payload of the writer's ``done`` pulse: ``error`` is set when a write response of the
    command was not OKAY (its data may not have reached memory)."""
    return data.StructLayout({"error": 1})


def _check_width(data_width):
    if (not isinstance(data_width, int) or data_width < 16 or data_width > 1024
            or data_width & (data_width - 1)):
        raise ValueError(f"data width must be a power of two from 16 to 1024, not {data_width!r}")


def _check_max_burst(max_burst):
    if not isinstance(max_burst, int) or not 1 <= max_burst <= 256 or max_burst & (max_burst - 1):
        raise ValueError(f"max_burst must be a power of two from 1 to 256 (AXI4 INCR), "
                         f"not {max_burst!r}")


def burst_beats(data_width, max_burst):
    """Largest burst the engine issues, in beats: ``max_burst`` or one 4 KiB page."""
    return min(max_burst, BOUNDARY // (data_width // 8))


def _max_beats(nbytes):
    # Address-aligned beats of the longest command at the worst offset.
    return (nbytes - 1 + (1 << LEN_BITS) - 1 + nbytes - 1) // nbytes


def burst_layout(data_width):
    """One burst of a command, as :class:`BurstSplitter` emits it.

    ``addr``: byte address of the burst's first byte (unaligned only in the command's first
    burst); ``len``: beats - 1 (``AxLEN``); ``first`` / ``last``: first / last burst of the
    command; ``offset``: the command's ``addr % B``; ``extra``: the command spans one more
    address-aligned beat than lane-0 beats (``ceil((offset+len)/B) > ceil(len/B)``); ``zero``:
    a zero-length command (one burst, no bus transfer); ``end_mask``: byte lanes of the
    command's last address-aligned beat that hold its data (``WSTRB`` of that beat, before the
    first-beat mask); ``keep_last``: ``keep`` of the command's last lane-0 beat.
    """
    nbytes = data_width // 8
    return data.StructLayout({
        "addr":      ADDR_BITS,
        "len":       8,
        "first":     1,
        "last":      1,
        "offset":    exact_log2(nbytes),
        "extra":     1,
        "zero":      1,
        "end_mask":  nbytes,
        "keep_last": nbytes,
    })


def _mask_below(value, nbytes):
    """Lanes ``[0, value)``, or all lanes when ``value == 0`` (a full last beat)."""
    # Lane 0 is always in; the top lane only for a full beat (no constant comparisons).
    return Cat(Const(1, 1), *((value == 0) | (value > i) for i in range(1, nbytes - 1)), value == 0)


class BurstSplitter(wiring.Component):
    """Splits commands into AXI4 bursts: one burst per clock.

    A command covers the address-aligned beats ``addr // B`` to ``(addr + len - 1) // B``; they
    are cut at every multiple of ``burst_beats(W, max_burst)`` beats (a power of two dividing
    4 KiB, so no burst crosses a 4 KiB boundary and none is longer than ``max_burst``).

    Ports:
      ``cmd``  in   stream ``cmd_layout()``.
      ``o``    out  stream ``burst_layout(W)``: the bursts of each command, in order; a
                    zero-length command gives one burst with ``zero`` set.

    Parameters: ``data_width`` (W), ``max_burst`` (power of two, 1..256).
    Latency: the first burst of a command is on ``o`` the cycle after the command transfer.
    Throughput: one burst per clock, also across commands (a command's first burst follows the
    previous command's last burst without a gap).
    """

    def __init__(self, data_width, max_burst=256):
        _check_width(data_width)
        _check_max_burst(max_burst)
        self.data_width = data_width
        self.max_burst = max_burst
        super().__init__({
            "cmd": In(stream.Signature(cmd_layout())),
            "o":   Out(stream.Signature(burst_layout(data_width))),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        LB = exact_log2(B)
        CB = burst_beats(self.data_width, self.max_burst)

        busy = Signal()
        beat = Signal(ADDR_BITS - LB)            # address-aligned beat address of the next burst
        rem = Signal(range(_max_beats(B) + 1))   # beats of the command not yet issued
        first = Signal()
        offset = Signal(LB)
        extra = Signal()
        zero = Signal()
        end_mask = Signal(B)
        keep_last = Signal(B)

        to_bound = Signal(range(CB + 1))         # beats up to the next burst boundary
        # `last` (rem <= to_bound: this burst ends the command) is a flip-flop, decided with the
        # rem / beat it belongs to: it drives `cmd.ready`, and through it the read enable of the
        # command FIFO in front (on the ECPIX-5 core the compare's carry chain there missed
        # 125 MHz by 1.4 ns over 155 endpoints).
        last = Signal()
        take = Signal(range(CB + 1))
        m.d.comb += [
            to_bound.eq(CB - beat[:exact_log2(CB)]),
            take.eq(Mux(last, rem, to_bound)),
        ]
        p = self.o.payload
        m.d.comb += [
            self.o.valid.eq(busy),
            p.addr.eq(Cat(Mux(first, offset, 0), beat)),
            p.len.eq(take - 1),
            p.first.eq(first),
            p.last.eq(last),
            p.offset.eq(offset),
            p.extra.eq(extra),
            p.zero.eq(zero),
            p.end_mask.eq(end_mask),
            p.keep_last.eq(keep_last),
        ]

        # After a burst that is not the last, beat is on a boundary: the next burst may take CB.
        rem_adv = Signal.like(rem)
        m.d.comb += rem_adv.eq(rem - to_bound)
        with m.If(self.o.valid & self.o.ready & ~last):
            # beat + to_bound: up to the next boundary, an increment of beat's upper bits
            kb = exact_log2(CB)
            m.d.sync += [beat.eq((beat[kb:] + 1) << kb), rem.eq(rem_adv), first.eq(0),
                         last.eq(rem_adv <= CB)]

        # The next command is loaded in the clock the current one's last burst leaves.
        load = ~busy | (self.o.ready & last)
        m.d.comb += self.cmd.ready.eq(load)
        c = self.cmd.payload
        end = Signal(LEN_BITS + 1)
        n_out = Signal(range(_max_beats(B) + 1))
        n_in = Signal(range(_max_beats(B) + 1))
        rem_ld = Signal.like(rem)
        m.d.comb += [
            end.eq(c.addr[:LB] + c.len),
            n_out.eq((end + (B - 1)) >> LB),
            n_in.eq((c.len + (B - 1)) >> LB),
            # A zero-length command is one burst with `zero` set.
            rem_ld.eq(Mux(c.len == 0, 1, n_out)),
        ]
        with m.If(load):
            m.d.sync += [
                busy.eq(self.cmd.valid),
                beat.eq(c.addr[LB:]),
                rem.eq(rem_ld),
                last.eq(rem_ld <= CB - c.addr[LB:LB + exact_log2(CB)]),
                first.eq(1),
                offset.eq(c.addr[:LB]),
                extra.eq(n_out != n_in),
                zero.eq(c.len == 0),
                end_mask.eq(_mask_below(end[:LB], B)),
                keep_last.eq(_mask_below(c.len[:LB], B)),
            ]
        return m


def _axi_static(m, axi, prefix, nbytes, id_value=0):
    """Drive the fixed address-channel fields: ID, full-width size, INCR, normal memory."""
    m.d.comb += [
        getattr(axi, f"{prefix}id").eq(id_value),
        getattr(axi, f"{prefix}size").eq(exact_log2(nbytes)),
        getattr(axi, f"{prefix}burst").eq(Burst.INCR),
        getattr(axi, f"{prefix}lock").eq(0),
        getattr(axi, f"{prefix}cache").eq(CACHE_NORMAL),
        getattr(axi, f"{prefix}prot").eq(PROT_DATA),
    ]


def _count_errors(m, fire, resp, error, errors):
    with m.If(fire & (resp != Resp.OKAY)):
        m.d.sync += error.eq(1)
        with m.If(errors != (1 << COUNTER_BITS) - 1):
            m.d.sync += errors.eq(errors + 1)


class DmaWriter(wiring.Component):
    """Writes lane-0 aligned stream data to byte addresses over the AXI4 write channels.

    Ports (``W`` = ``data_width``, ``B = W / 8``):
      ``cmd``     in   stream ``{addr: 64, len: 16}``: write ``len`` bytes at byte ``addr``.
      ``i``       in   stream ``beat_layout(W)``: the bytes of each command, in command order,
                       aligned to lane 0, ``max(1, ceil(len / B))`` beats (one ``keep == 0``
                       beat for ``len == 0``). The engine counts beats from ``len``: ``keep``
                       and ``last`` are not looked at, and no byte outside ``[addr, addr+len)``
                       is ever strobed, whatever the stream says.
      ``done``    out  stream ``done_layout()``, always ready: a one-cycle pulse per command,
                       in command order, the cycle after the B response of its last burst
                       (every write of it is then visible to later readers); ``error`` when
                       one of its B responses was not OKAY. Zero-length commands pulse too.
      ``error``   out  sticky: a B response other than OKAY was seen.
      ``errors``  out  16 bits: number of such responses (saturating).
      ``axi``     out  ``Axi4Signature(addr_width, W, id_width)``: drives the write channels
                       (aw, w, b); the read channels are idle (``arvalid = rready = 0``).
                       :func:`connect_axi` / :class:`Dma` share one bus with a reader.

    Parameters: ``data_width`` (power of two, 16..1024),
    ``addr_width`` (of ``awaddr``, the command address is truncated to it), ``id_width``,
    ``max_burst`` (beats, power of two <= 256; bursts are also cut at 4 KiB),
    ``outstanding`` (bursts issued and not yet answered by B; the tracking FIFO depth).

    Bus behaviour: a burst's AW (into the AW register) and its W descriptor (into the W
    datapath's queue) are queued in the same clock, when its command starts; from there the
    channels are independent: W never waits for AW acceptance and AW never waits for W data
    (A3.3.1: no deadlock with any subordinate), and an AW may be on the bus before its data
    arrived on ``i``. Up to
    ``outstanding`` bursts may wait for their B responses. ``bready`` is high whenever a burst
    is outstanding (but for the one cycle in which a zero-length command ahead of it retires).

    Latency (cycles after the ``cmd`` transfer, no stalls): ``awvalid`` at +2, the first
    ``wvalid`` at +4 (if the data beat is there), ``done`` 1 cycle after the last B (a
    zero-length command with nothing ahead of it: ``done`` at +4).
    Throughput: one W beat per clock in steady state, also across back-to-back commands (no
    bubble between commands when addresses are aligned; an unaligned command whose bytes span
    one more bus beat than stream beats costs that one extra beat). A zero-length command
    costs one cycle without a W beat. Each burst holds a tracking entry from its split to its B
    response, so with a write latency of ``L`` cycles (last W beat to B) trains of one-beat
    commands keep that rate only with ``outstanding >= L + 4`` (the default 16: ``L <= 12``).
    """

    def __init__(self, data_width, *, addr_width=64, id_width=4, max_burst=256, outstanding=16):
        _check_width(data_width)
        _check_max_burst(max_burst)
        if outstanding < 2:
            raise ValueError(f"outstanding must be at least 2, not {outstanding!r}")
        self.data_width = data_width
        self.addr_width = addr_width
        self.id_width = id_width
        self.max_burst = max_burst
        self.outstanding = outstanding
        super().__init__({
            "cmd":    In(stream.Signature(cmd_layout())),
            "i":      In(stream.Signature(beat_layout(data_width))),
            "done":   Out(stream.Signature(done_layout(), always_ready=True)),
            "error":  Out(1),
            "errors": Out(COUNTER_BITS),
            "axi":    Out(Axi4Signature(addr_width, data_width, id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        B = W // 8
        LB = exact_log2(B)
        axi = self.axi
        full = (1 << B) - 1

        m.submodules.split = split = BurstSplitter(W, self.max_burst)
        wiring.connect(m, wiring.flipped(self.cmd), split.cmd)

        wdesc = data.StructLayout({
            "len": 8, "first": 1, "last": 1, "offset": LB, "extra": 1, "zero": 1, "end_mask": B,
        })
        track = data.StructLayout({"last": 1, "zero": 1})
        # Descriptors for the W datapath: a few suffice, the splitter makes one per clock.
        m.submodules.wq = wq = SyncFIFOBuffered(width=wdesc.size, depth=8)
        m.submodules.bq = bq = SyncFIFOBuffered(width=track.size, depth=self.outstanding)

        # --- split -> AW register, W descriptors, B tracking (all three in the same clock) ---
        b = split.o.payload
        awvalid = Signal()
        aw_free = ~awvalid | axi.awready
        room = wq.w_rdy & bq.w_rdy & (aw_free | b.zero)
        push = split.o.valid & room
        m.d.comb += [
            split.o.ready.eq(room),
            wq.w_en.eq(push),
            bq.w_en.eq(push),
        ]
        wd = data.View(wdesc, wq.w_data)
        td = data.View(track, bq.w_data)
        m.d.comb += [
            wd.len.eq(b.len), wd.first.eq(b.first), wd.last.eq(b.last), wd.offset.eq(b.offset),
            wd.extra.eq(b.extra), wd.zero.eq(b.zero), wd.end_mask.eq(b.end_mask),
            td.last.eq(b.last), td.zero.eq(b.zero),
        ]
        _axi_static(m, axi, "aw", B)
        with m.If(axi.awready):
            m.d.sync += awvalid.eq(0)
        with m.If(push & ~b.zero):
            m.d.sync += [
                awvalid.eq(1),
                axi.awaddr.eq(b.addr[:self.addr_width]),
                axi.awlen.eq(b.len),
            ]
        m.d.comb += axi.awvalid.eq(awvalid)

        # --- W datapath: output beat k of a command = lanes [B-offset, 2B-offset) of
        # {stream beat k, stream beat k-1}; the first beat's lanes below the offset and the
        # last beat's lanes past the end are strobed off. ---
        d = data.View(wdesc, wq.r_data)
        dv = wq.r_rdy
        cnt = Signal(8)                  # beats sent of the burst at the head
        prev = Signal(W)                 # the stream beat taken before
        wvalid = Signal()
        w_free = ~wvalid | axi.wready
        burst_end = cnt == d.len
        cmd_end = d.last & burst_end
        # The extra address-aligned beat at the end of a command uses only the previous beat.
        take_in = ~(cmd_end & d.extra)
        first_beat = d.first & (cnt == 0)
        go = Signal()
        m.d.comb += go.eq(dv & ~d.zero & w_free & (self.i.valid | ~take_in))

        shift = Signal(LB + 1)
        m.d.comb += shift.eq(B - d.offset)
        shifted = Cat(prev, self.i.payload.data).bit_select(Cat(Const(0, 3), shift), W)
        strb = Signal(B)
        first_mask = Cat(d.offset == 0, *(d.offset <= i for i in range(1, B - 1)), Const(1, 1))
        m.d.comb += strb.eq(Mux(first_beat, first_mask, full) & Mux(cmd_end, d.end_mask, full))

        with m.If(dv & d.zero):
            # A zero-length command: drop its one (empty) beat.
            m.d.comb += [self.i.ready.eq(1), wq.r_en.eq(self.i.valid)]
        with m.Else():
            m.d.comb += self.i.ready.eq(dv & w_free & take_in)

        with m.If(axi.wready):
            m.d.sync += wvalid.eq(0)
        with m.If(go):
            m.d.sync += [
                wvalid.eq(1),
                axi.wdata.eq(shifted),
                axi.wstrb.eq(strb),
                axi.wlast.eq(burst_end),
                cnt.eq(Mux(burst_end, 0, cnt + 1)),
            ]
            m.d.comb += wq.r_en.eq(burst_end)
            with m.If(take_in):
                m.d.sync += prev.eq(self.i.payload.data)
        m.d.comb += axi.wvalid.eq(wvalid)

        # --- B responses: one tracking entry per burst, in issue order; a zero-length
        # command's entry completes without a response. ---
        h = data.View(track, bq.r_data)
        hv = bq.r_rdy
        cmd_err = Signal()               # an earlier burst of the command at the head failed
        m.d.comb += axi.bready.eq(hv & ~h.zero)
        bfire = axi.bvalid & axi.bready
        berr = axi.bresp != Resp.OKAY
        done_valid = Signal()
        done_error = Signal()
        m.d.sync += done_valid.eq(0)
        with m.If(hv & h.zero):
            m.d.comb += bq.r_en.eq(1)
            m.d.sync += [done_valid.eq(1), done_error.eq(0)]
        with m.Elif(bfire):
            m.d.comb += bq.r_en.eq(1)
            with m.If(h.last):
                m.d.sync += [done_valid.eq(1), done_error.eq(cmd_err | berr), cmd_err.eq(0)]
            with m.Else():
                m.d.sync += cmd_err.eq(cmd_err | berr)
        m.d.comb += [self.done.valid.eq(done_valid), self.done.payload.error.eq(done_error)]
        _count_errors(m, bfire, axi.bresp, self.error, self.errors)

        # The read channels belong to a reader sharing the bus (connect_axi).
        m.d.comb += [axi.arvalid.eq(0), axi.rready.eq(0)]
        return m


class DmaReader(wiring.Component):
    """Reads byte ranges over the AXI4 read channels into lane-0 aligned stream data.

    Ports (``W`` = ``data_width``, ``B = W / 8``):
      ``cmd``     in   stream ``{addr: 64, len: 16}``: read ``len`` bytes at byte ``addr``.
      ``o``       out  stream ``beat_layout(W)``: the bytes of each command aligned to lane 0,
                       ``max(1, ceil(len / B))`` beats, ``keep`` all ones but on the last beat,
                       ``last`` on the last beat; commands in order. Lanes with ``keep == 0``
                       carry junk. ``len == 0``: one beat ``keep == 0, last``, no bus traffic.
      ``error``   out  sticky: an R beat with ``RRESP`` other than OKAY was seen (its data is
                       delivered as the subordinate sent it).
      ``errors``  out  16 bits: number of such beats (saturating).
      ``axi``     out  ``Axi4Signature(addr_width, W, id_width)``: drives the read channels
                       (ar, r); the write channels are idle (``awvalid = wvalid = bready = 0``).

    Parameters: ``data_width``, ``addr_width``, ``id_width``, ``max_burst`` as for
    :class:`DmaWriter`; ``outstanding``: bursts issued on AR and not yet fully received;
    ``buffer``: R data buffer in beats (default four maximal bursts, at least one).

    Bus behaviour: ARs for later commands are issued while earlier data still streams out, up
    to ``outstanding`` bursts, each only when the buffer has room for its whole burst (space
    is reserved at AR issue and freed as beats leave the buffer), so ``rready`` is always high
    and a back-pressured ``o`` never blocks the bus or deadlocks it.

    Latency (cycles, no stalls): ``arvalid`` 3 cycles after the ``cmd`` transfer (a register
    stage sits between the burst splitter and the AR issue); a beat on ``o`` 3 cycles after its
    R beat (aligned command; an unaligned command's output beat needs the next R beat too). A
    zero-length command's beat appears 5 cycles after its ``cmd`` transfer (it queues behind
    earlier commands' data).
    Throughput: one ``o`` beat per clock in steady state, with no bubble between back-to-back
    aligned commands; an unaligned command costs one extra cycle (its first R beat only primes
    the shifter). This needs enough reads in flight to cover the subordinate's read latency
    ``L`` (AR accepted to its first R beat): ``buffer >= L + 3 + b`` beats for bursts of ``b``
    beats (space is reserved per whole burst), and ``outstanding >= L + 2`` for trains of
    one-beat commands. The defaults (16 bursts, four maximal bursts of buffer) keep the rate
    up to ``L = 3 * burst_beats(W, max_burst) - 3`` for long commands (189 cycles at 512 bits)
    and ``L = 14`` for one-beat commands.
    """

    def __init__(self, data_width, *, addr_width=64, id_width=4, max_burst=256, outstanding=16,
                 buffer=None):
        _check_width(data_width)
        _check_max_burst(max_burst)
        cb = burst_beats(data_width, max_burst)
        if buffer is None:
            buffer = 4 * cb
        if buffer < max(cb, 2):
            raise ValueError(f"buffer ({buffer} beats) must hold a whole burst ({cb} beats)")
        if outstanding < 1:
            raise ValueError(f"outstanding must be at least 1, not {outstanding!r}")
        self.data_width = data_width
        self.addr_width = addr_width
        self.id_width = id_width
        self.max_burst = max_burst
        self.outstanding = outstanding
        self.buffer = buffer
        super().__init__({
            "cmd":    In(stream.Signature(cmd_layout())),
            "o":      Out(stream.Signature(beat_layout(data_width))),
            "error":  Out(1),
            "errors": Out(COUNTER_BITS),
            "axi":    Out(Axi4Signature(addr_width, data_width, id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        B = W // 8
        LB = exact_log2(B)
        axi = self.axi
        full = (1 << B) - 1

        m.submodules.split = split = BurstSplitter(W, self.max_burst)
        wiring.connect(m, wiring.flipped(self.cmd), split.cmd)
        # A register stage between the splitter and the AR issue: the splitter's next-burst
        # arithmetic (boundary, last, take) and the issue checks (buffer room, bursts in flight)
        # were one chain of carry chains, 10.6 ns on an ECP5 at speed 8.
        m.submodules.split_reg = sreg = SkidBuffer(burst_layout(W))
        wiring.connect(m, split.o, sreg.i)

        rdesc = data.StructLayout({
            "len": 8, "last": 1, "offset": LB, "extra": 1, "zero": 1, "keep_last": B,
        })
        # Descriptors wait here from AR issue until their data has left: room for every burst
        # on the bus plus those whose data sits in the buffer.
        m.submodules.dq = dq = SyncFIFOBuffered(width=rdesc.size, depth=2 * self.outstanding + 2)
        m.submodules.rq = rq = SyncFIFOBuffered(width=W, depth=self.buffer)

        # Buffer beats neither reserved nor occupied. Kept as the room left (not as the beats
        # committed) so the issue check is one compare, ``len < space``, not an add and a
        # compare: from the split register's read pointer through both to the descriptor
        # queue's write enable it was 10.10 ns routed on the ECPIX-5 core at 245eb29.
        space = Signal(range(self.buffer + 1), init=self.buffer)
        inflight = Signal(range(self.outstanding + 1))  # bursts issued, last beat not received

        # --- split -> AR register + R descriptors ---
        b = sreg.o.payload
        beats = b.len + 1
        arvalid = Signal()
        ar_ok = ((~arvalid | axi.arready) & (inflight < self.outstanding)
                 & (b.len < space))                # beats = len + 1 <= space
        room = dq.w_rdy & (b.zero | ar_ok)
        push = sreg.o.valid & room
        issue = push & ~b.zero
        m.d.comb += [sreg.o.ready.eq(room), dq.w_en.eq(push)]
        rd = data.View(rdesc, dq.w_data)
        m.d.comb += [
            rd.len.eq(b.len), rd.last.eq(b.last), rd.offset.eq(b.offset), rd.extra.eq(b.extra),
            rd.zero.eq(b.zero), rd.keep_last.eq(b.keep_last),
        ]
        _axi_static(m, axi, "ar", B)
        with m.If(axi.arready):
            m.d.sync += arvalid.eq(0)
        with m.If(issue):
            m.d.sync += [
                arvalid.eq(1),
                axi.araddr.eq(b.addr[:self.addr_width]),
                axi.arlen.eq(b.len),
            ]
        m.d.comb += axi.arvalid.eq(arvalid)

        # --- R -> buffer. Space was reserved at AR issue, so the buffer always has room. ---
        rfire = axi.rvalid & axi.rready
        m.d.comb += [
            axi.rready.eq(rq.w_rdy),
            rq.w_en.eq(axi.rvalid),
            rq.w_data.eq(axi.rdata),
        ]
        _count_errors(m, rfire, axi.rresp, self.error, self.errors)
        m.d.sync += inflight.eq(inflight + issue - (rfire & axi.rlast))
        pop = rq.r_en & rq.r_rdy
        m.d.sync += space.eq(space - Mux(issue, beats, 0) + pop)

        # --- realign: output beat k of a command = lanes [offset, offset+B) of {R beat k+1,
        # R beat k}. Aligned commands pass R beats straight through. ---
        d = data.View(rdesc, dq.r_data)
        dv = dq.r_rdy
        r = rq.r_data
        rv = rq.r_rdy
        cnt = Signal(9)                  # R beats taken of the burst at the head (0..len+1)
        # cnt - 1, kept beside it (all ones for 0), so that "beats remain" is a compare of two
        # registers rather than one behind an adder: it enables the R buffer's read (from cnt
        # through d.len + 1 and the compare to the buffer's output load enable it was 10.2 ns
        # routed on the ECPIX-5 core at 2c5ea0a)
        cnt_m1 = Signal(9, init=0x1FF)
        hold = Signal(W)                 # R beat k, waiting for beat k+1
        held = Signal()
        ovalid = Signal()
        o_free = ~ovalid | self.o.ready
        burst_end = cnt == d.len         # the R beat at the buffer head is the burst's last
        more = cnt_m1 != d.len           # R beats of this burst remain (cnt != d.len + 1)
        aligned = d.offset == 0

        emit = Signal()
        e_data = Signal(W)
        e_keep = Signal(B)
        e_last = Signal()
        consume = Signal()               # take the R beat at the buffer head
        advance = Signal()               # update cnt (and pop the descriptor at burst end)

        shifted = Cat(hold, r).bit_select(Cat(Const(0, 3), d.offset), W)
        with m.If(dv):
            with m.If(d.zero):
                m.d.comb += [emit.eq(o_free), e_keep.eq(0), e_last.eq(1), dq.r_en.eq(o_free)]
            with m.Elif(aligned):
                m.d.comb += [
                    emit.eq(rv & o_free), e_data.eq(r), e_last.eq(d.last & burst_end),
                    e_keep.eq(Mux(d.last & burst_end, d.keep_last, full)),
                    consume.eq(rv & o_free), advance.eq(rv & o_free),
                ]
            with m.Elif(held & ~more):
                # Flush: the command's last output beat lies wholly in its last R beat.
                m.d.comb += [emit.eq(o_free), e_data.eq(shifted), e_keep.eq(d.keep_last),
                             e_last.eq(1), dq.r_en.eq(o_free)]
                with m.If(o_free):
                    m.d.sync += [held.eq(0), cnt.eq(0), cnt_m1.eq(0x1FF)]
            with m.Elif(~held):
                # The command's first R beat only primes the shifter.
                m.d.comb += [consume.eq(rv), advance.eq(rv)]
                with m.If(rv):
                    m.d.sync += [hold.eq(r), held.eq(1)]
            with m.Else():
                final = d.last & burst_end & d.extra
                m.d.comb += [
                    emit.eq(rv & o_free), e_data.eq(shifted), e_last.eq(final),
                    e_keep.eq(Mux(final, d.keep_last, full)),
                    consume.eq(rv & o_free), advance.eq(rv & o_free),
                ]
                with m.If(rv & o_free):
                    m.d.sync += [hold.eq(r), held.eq(~final)]
        m.d.comb += rq.r_en.eq(consume)
        with m.If(advance):
            with m.If(~burst_end):
                m.d.sync += [cnt.eq(cnt + 1), cnt_m1.eq(cnt)]
            with m.Elif(d.last & ~aligned & ~d.extra):
                # park: the flush beat still has to go out
                m.d.sync += [cnt.eq(cnt + 1), cnt_m1.eq(cnt)]
            with m.Else():
                m.d.sync += [cnt.eq(0), cnt_m1.eq(0x1FF)]
                m.d.comb += dq.r_en.eq(1)

        with m.If(self.o.ready):
            m.d.sync += ovalid.eq(0)
        with m.If(emit):
            m.d.sync += [
                ovalid.eq(1),
                self.o.payload.data.eq(e_data),
                self.o.payload.keep.eq(e_keep),
                self.o.payload.last.eq(e_last),
            ]
        m.d.comb += self.o.valid.eq(ovalid)

        # The write channels belong to a writer sharing the bus (connect_axi).
        m.d.comb += [axi.awvalid.eq(0), axi.wvalid.eq(0), axi.bready.eq(0)]
        return m


def _write_member(name):
    return name.startswith(("aw", "w", "b"))


def connect_axi(m, bus, *, write=None, read=None):
    """Drive the AXI4 master port ``bus`` (an ``Out(Axi4Signature)`` port of the component
    being elaborated) from the write channels of ``write`` and the read channels of ``read``
    (``axi`` ports of a :class:`DmaWriter` / :class:`DmaReader`, or any ``Axi4Signature``
    master interface). A channel group left ``None`` is tied idle."""
    for name, member in bus.signature.members.items():
        src = write if _write_member(name) else read
        ours = getattr(bus, name)
        if member.flow == Out:
            m.d.comb += ours.eq(getattr(src, name) if src is not None else 0)
        elif src is not None:
            m.d.comb += getattr(src, name).eq(ours)


class Dma(wiring.Component):
    """A :class:`DmaWriter` and a :class:`DmaReader` sharing one AXI4 master ``m_axi`` (the
    writer owns aw/w/b, the reader ar/r; the channels are independent, so neither waits for
    the other).

    Ports: ``m_axi`` (out ``Axi4Signature(addr_width, W, id_width)``); ``wr_cmd``, ``wr_data``,
    ``wr_done``, ``wr_error``, ``wr_errors`` (the writer's ``cmd``, ``i``, ``done``,
    ``error``, ``errors``); ``rd_cmd``, ``rd_data``, ``rd_error``, ``rd_errors`` (the reader's
    ``cmd``, ``o``, ``error``, ``errors``). Parameters as for the two engines; ``outstanding``
    and ``buffer`` apply to the reader, ``wr_outstanding`` to the writer.
    Attributes: ``writer``, ``reader``.
    """

    def __init__(self, data_width, *, addr_width=64, id_width=4, max_burst=256, outstanding=16,
                 buffer=None, wr_outstanding=16):
        self.writer = DmaWriter(data_width, addr_width=addr_width, id_width=id_width,
                                max_burst=max_burst, outstanding=wr_outstanding)
        self.reader = DmaReader(data_width, addr_width=addr_width, id_width=id_width,
                                max_burst=max_burst, outstanding=outstanding, buffer=buffer)
        self.data_width = data_width
        w, r = self.writer.signature.members, self.reader.signature.members
        super().__init__({
            "m_axi":     Out(Axi4Signature(addr_width, data_width, id_width)),
            "wr_cmd":    w["cmd"],
            "wr_data":   w["i"],
            "wr_done":   w["done"],
            "wr_error":  w["error"],
            "wr_errors": w["errors"],
            "rd_cmd":    r["cmd"],
            "rd_data":   r["o"],
            "rd_error":  r["error"],
            "rd_errors": r["errors"],
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.writer = wr = self.writer
        m.submodules.reader = rd = self.reader
        wiring.connect(m, wiring.flipped(self.wr_cmd), wr.cmd)
        wiring.connect(m, wiring.flipped(self.wr_data), wr.i)
        wiring.connect(m, wr.done, wiring.flipped(self.wr_done))
        wiring.connect(m, wiring.flipped(self.rd_cmd), rd.cmd)
        wiring.connect(m, rd.o, wiring.flipped(self.rd_data))
        m.d.comb += [
            self.wr_error.eq(wr.error), self.wr_errors.eq(wr.errors),
            self.rd_error.eq(rd.error), self.rd_errors.eq(rd.errors),
        ]
        connect_axi(m, self.m_axi, write=wr.axi, read=rd.axi)
        return m
