# Ref: ARM IHI 0022E "AMBA AXI and ACE Protocol Specification", part B (AXI4-Lite).
"""The CSR bank: the register map of ``stellar.hdl.regmap`` behind an AXI4-Lite subordinate.

Everything here is generated from a ``RegisterMap``; nothing about individual registers is
written by hand, so the gateware cannot drift from the host driver's view.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .axil import AxiLiteSignature, Resp
from .regmap import BLOCK_SIZE, REGMAP

__all__ = ["block_signature", "AxiLiteCsrBank"]


def _or_all(values):
    """OR of ``values`` as a balanced tree (a chain would be as deep as it is long)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] | values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def block_signature(block):
    """Register ports of one ``regmap.Block``, seen from the gateware that owns the block.

    ``ro`` (not ``const``) -> ``Out(width)`` named like the register (the block drives it);
    ``counter`` -> ``Out(1)`` named ``<name>_inc`` (high for one clock per event);
    ``rw``, ``wo`` -> ``In(width, init=init)`` named like the register (the block obeys it).
    ``command`` -> ``In(width)`` named like the register (the value last written) and ``In(1)``
    named ``<name>_stb`` (high for the one clock in which that value is new).
    ``const`` and ``clear`` registers live entirely in the bank and have no port.
    Returns ``None`` if the block has no port at all.

    A block can declare ``csr: Out(block_signature(REGMAP.block("pktengine")))`` and be joined to
    the bank with ``connect(m, engine.csr, bank.pktengine)``; or a top assigns single ports.
    """
    members = {}
    for r in block.registers:
        if r.access == "ro" and not r.const:
            members[r.name] = Out(r.width)
        elif r.access in ("rw", "wo"):
            members[r.name] = In(r.width, init=r.init)
        elif r.access == "counter":
            members[f"{r.name}_inc"] = Out(1)
        elif r.access == "command":
            members[r.name] = In(r.width)
            members[f"{r.name}_stb"] = In(1)
    return wiring.Signature(members) if members else None


def _group_word(block, reg):
    """The word address of ``block``'s register ``reg`` inside its ``BLOCK_SIZE`` group."""
    return ((block.base + reg.offset) & (BLOCK_SIZE - 1)) >> 2

class AxiLiteCsrBank(wiring.Component):
    """AXI4-Lite subordinate holding every register of a register map.

    Parameters
    ----------
    regmap : regmap.RegisterMap
        The map to implement; defaults to the design's ``REGMAP``.
    addr_width : int
        Width of the AXI byte address; the map must fit (``regmap.span <= 2**addr_width``).
        Address bits 1:0 are ignored (every access is a whole 32-bit word, lanes by ``wstrb``).
    shadow_rw : int
        A ``BLOCK_SIZE`` group with at least this many ``rw`` registers answers their reads
        from a LUT RAM copy (below). The default, 8, gives the transport and congestion-control
        blocks of ``REGMAP`` a copy; a value above any group's count (or 0) gives none.

    Ports
    -----
    s_axil : In(AxiLiteSignature(addr_width, 32))
        The register bus. ``awprot``/``arprot`` are ignored.
    <block> : In(block_signature(block)), one per block that has ports, e.g. ``pktengine``:
        ``<block>.<name>``      In(width)  for each ``ro`` register: the value reads return;
        ``<block>.<name>_inc``  In(1)      for each ``counter``: +1 in every clock it is high;
        ``<block>.<name>``      Out(width) for each ``rw`` / ``wo`` register: the value last written
                                           (reset to ``init``), updated in the clock the
                                           write's B response is first offered.
        ``<block>.<name>``      Out(width) for each ``command``: the value last written
        ``<block>.<name>_stb``  Out(1)     ... high for one clock when it is written (the clock
                                           B is first offered, with the new value).
        The ``ident`` block exposes ``ident.scratch`` (unused by gateware).

    Bus behaviour
    -------------
    * AW and W are accepted independently, in either order or together, into one-entry
      holding registers (``awready``/``wready`` are low while their entry is full); the write
      is taken once both are present and the B channel is free, reaches the registers through
      a registered copy per ``BLOCK_SIZE`` group of the map (2 clocks later) and is answered on
      B in the clock the registers change.
    * One read at a time: ``arready`` is high while no read is pending; the address is taken
      at the AR handshake, the registers are sampled in the clock after it (into one word per
      eight registers of each ``BLOCK_SIZE`` group of the map), each group's word is selected
      from those a clock later, the addressed group's word a clock after that, and joined with
      the counters' read-back in the next clock (``rvalid`` rises 5 clocks after the
      handshake) and held, with its response, until ``rready``.
    * B and R are held stable under backpressure; no output depends combinationally on an input.
    * Responses: OKAY for mapped registers. SLVERR (with ``rdata`` 0) for reads of unmapped
      addresses and for writes to unmapped addresses or to registers the host cannot write
      (``ro``, ``counter``) -- such writes change nothing. SLVERR rather than OKAY so a driver bug
      shows up as a bus error (a PCIe adapter turns it into an unsuccessful completion).
    * ``rw`` registers honour ``wstrb`` byte lanes; bits beyond the register width read 0.
      ``wo`` registers are written like ``rw`` and read 0 (not in the read multiplexer).
    * ``command`` registers: every accepted write presents its value (lanes not strobed read
      as 0) with a one-clock ``_stb`` pulse; reads return 0.
    * ``clear`` registers: a write with ``wstrb[0]`` and ``wdata[0]`` set zeroes every counter
      of the block; an increment in that same clock is counted (the counter becomes 1).
      They read as 0.
    * Counter latency: an ``_inc`` pulse shows in reads 2 clocks later (increment registered,
      then added; a read returns the value of the clock after its AR handshake); a clear takes
      effect 3 clocks after the write is taken, i.e. in the clock the B response is first
      offered is still the old value, from the next clock on the cleared one (a read issued
      after the B handshake always sees it).
    * Throughput: a write every 2 clocks, a read every 6 clocks, both channels concurrently.
    * Read-back copies: in a ``BLOCK_SIZE`` group with at least ``shadow_rw`` ``rw`` registers,
      reads of those registers come from a LUT RAM copy written alongside them (see the read
      path), not from the registers. The copy is loaded with the reset values in the
      ``BLOCK_SIZE // 4`` clocks after a reset, while the bank takes no read or write (requests
      wait in their channels); banks without such a group answer from the first clock.
    """

    def __init__(self, regmap=REGMAP, *, addr_width=16, shadow_rw=8):
        if regmap.span > 1 << addr_width:
            self._MustUse__silence = True  # no "created but never used" warning for a failed build
            raise ValueError(f"register map spans {regmap.span:#x} bytes, more than a {addr_width}-bit "
                             f"address reaches")
        self._regmap = regmap
        self._addr_width = addr_width
        self._shadow_rw = shadow_rw
        members = {"s_axil": In(AxiLiteSignature(addr_width, 32))}
        for block in regmap.blocks:
            sig = block_signature(block)
            if sig is not None:
                members[block.name] = In(sig)
        super().__init__(members)

    @property
    def regmap(self):
        return self._regmap

    @property
    def addr_width(self):
        return self._addr_width

    def elaborate(self, platform):
        m = Module()
        bus = self.s_axil
        word = slice(2, self._addr_width)  # word index: AXI-Lite accesses are whole words here

        # The counters, (block, name) in the order of their words in the counter RAM (ro/rw
        # values live on the ports themselves).
        c_list = []
        clears = {}
        for block in self._regmap.blocks:
            clears[block.name] = Signal(name=f"{block.name}_clear")
            c_list += [(block, r) for r in block.counters]

        # --- write path ------------------------------------------------------------------
        # AW and W arrive independently (AXI allows W before AW), so each gets its own
        # one-entry holding register; the write happens when both are present.
        scrubbing = Signal()    # the read-back copies take their reset values (below)
        aw_full = Signal()
        aw_addr = Signal(self._addr_width)
        w_full = Signal()
        w_data = Signal(32)
        w_strb = Signal(4)
        m.d.comb += [
            bus.awready.eq(~aw_full),
            bus.wready.eq(~w_full),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(bus.awaddr)]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]

        # Timing: the write is performed in two steps, so that no wire crosses the die to every
        # writable register. (1) When both entries are full, each group of the map (its
        # BLOCK_SIZE window, one block) takes its own registered copy of the word address
        # inside the group, the data and the strobes, loaded only by a write to that group (the
        # copies have different enables, so Yosys does not merge them); (2) a clock later the
        # group's registers are written from its copy. The copies sit next to the registers they
        # serve, so between the bus and a group run only its copy's 43 inputs; before, the one
        # write-data register fed every writable register of the core (about 2,400 flip-flops
        # in every block), and in the ECPIX-5 routing its nets were among the most overused
        # (README, board notes). B is answered in the clock after the copy, the clock the
        # registers change in, so a read issued after the B handshake sees the write.
        wpend = Signal()        # step 2 in this clock
        # Step 1 (do_write) is itself a flip-flop, decided a clock ahead: both entries full,
        # no write under way (step 1 or 2) and the response slot empty. Each group's copy loads
        # on its own flip-flop of that decision (g_load below), so the decision, which gates the
        # copies of every group, reaches them through flip-flops next to them (from the
        # scrub flag through the response handshake to the copies' load enables it was 9.9 ns
        # routed on the ECPIX-5 core at 41d0b9a). A write takes a clock longer; CSR writes
        # come from the host one at a time.
        do_write = Signal()
        do_write_next = Signal()
        m.d.comb += do_write_next.eq(aw_full & w_full & ~do_write & ~wpend & ~bus.bvalid
                                     & ~scrubbing)
        m.d.sync += [do_write.eq(do_write_next), wpend.eq(do_write)]

        w_resp = Signal(Resp)
        m.d.comb += w_resp.eq(Resp.SLVERR)
        group_bits = (BLOCK_SIZE - 1).bit_length()       # byte-address bits inside a group
        groups = {}
        for block in self._regmap.blocks:
            for r in block.registers:
                groups.setdefault((block.base + r.offset) >> group_bits, []).append((block, r))
                if r.access == "command":
                    # A one-clock pulse: set again below in the clock after a write.
                    m.d.sync += getattr(getattr(self, block.name), f"{r.name}_stb").eq(0)
        with m.Switch(aw_addr[word]):
            for block in self._regmap.blocks:
                for r in block.registers:
                    if r.access in ("rw", "wo", "command", "clear"):
                        with m.Case((block.base + r.offset) >> 2):
                            m.d.comb += w_resp.eq(Resp.OKAY)
        resp_r = Signal(Resp)
        with m.If(do_write):
            m.d.sync += resp_r.eq(w_resp)

        # Read-back copies. The transport's and congestion control's configuration (760 and
        # 560 bits of rw registers) were inputs of their groups' read multiplexers: every one of
        # those flip-flops, wherever its block put it, sent a wire to the multiplexer, and in
        # the ECPIX-5 routing those multiplexers were among the most overused nets (README,
        # board notes). The registers stay (the blocks use them); reads come from a LUT RAM
        # copy per such group, one 32-bit word per address of the group, written with the same
        # lanes in the same clock as the register, so it holds what the register holds. A LUT
        # RAM is not reset, so after a reset a counter walks the addresses and writes each
        # register's reset value while the bus waits. Written by hand: a register file with a
        # read-back copy is not something amaranth.lib offers.
        g_words = BLOCK_SIZE // 4
        shadows = {}
        for g, regs in sorted(groups.items()):
            rw = {_group_word(block, r): r
                  for block, r in regs if r.access == "rw"}
            if rw and 0 < self._shadow_rw <= len(rw):
                mem = Memory(shape=32, depth=g_words,
                             init=[rw[i].init if i in rw else 0 for i in range(g_words)],
                             attrs={"ram_style": "distributed"})
                m.submodules[f"rd_group{g:x}_copy"] = mem
                shadows[g] = (mem.write_port(granularity=8), mem.read_port(domain="comb"), rw)
        scrub = None
        if shadows:
            # ``scrubbing`` straight from a flip-flop: it gates every write and read of the
            # bank, and as a compare of the counter it was the start of 304 of the ECPIX-5
            # core's failing paths (routed, 2026-12-07).
            scrub = Signal(range(g_words))
            scrub_busy = Signal(init=1)
            m.d.comb += scrubbing.eq(scrub_busy)
            with m.If(scrub_busy):
                m.d.sync += scrub.eq(scrub + 1)
                with m.If(scrub == g_words - 1):
                    m.d.sync += scrub_busy.eq(0)

        for g, regs in sorted(groups.items()):
            g_we = Signal(name=f"wr_group{g:x}_we")
            g_addr = Signal(group_bits - 2, name=f"wr_group{g:x}_addr")
            g_data = Signal(32, name=f"wr_group{g:x}_data")
            g_strb = Signal(4, name=f"wr_group{g:x}_strb")
            g_load = Signal(name=f"wr_group{g:x}_load")     # step 1 for this group
            m.d.sync += [g_load.eq(do_write_next & (aw_addr[group_bits:] == g)), g_we.eq(g_load)]
            with m.If(g_load):
                m.d.sync += [g_addr.eq(aw_addr[2:group_bits]), g_data.eq(w_data),
                             g_strb.eq(w_strb)]
            if g in shadows:
                wp, _rp, rw = shadows[g]
                is_rw = Signal(name=f"wr_group{g:x}_copy_rw")
                mask = Signal(32, name=f"wr_group{g:x}_copy_mask")   # the register's width
                init = Signal(32, name=f"wr_group{g:x}_copy_init")
                with m.Switch(g_addr):
                    for i, r in rw.items():
                        with m.Case(i):
                            m.d.comb += [is_rw.eq(1), mask.eq((1 << r.width) - 1)]
                with m.Switch(scrub[:group_bits - 2]):
                    for i, r in rw.items():
                        with m.Case(i):
                            m.d.comb += init.eq(r.init)
                with m.If(scrubbing):
                    m.d.comb += [wp.addr.eq(scrub), wp.data.eq(init), wp.en.eq(0b1111)]
                with m.Else():
                    m.d.comb += [wp.addr.eq(g_addr), wp.data.eq(g_data & mask),
                                 wp.en.eq(Mux(g_we & is_rw, g_strb, 0))]
            # Step 2 per register: its write enable is a flip-flop of its own, set with the
            # group's g_we from the word address (rather than the copy's address decoded in
            # front of every register's enable: from the copy through the decode to the
            # registers, spread over their block, it was 10.3 ns routed on the ECPIX-5 core at
            # d76ba5e).
            for block, r in regs:
                if r.access not in ("rw", "wo", "command", "clear"):
                    continue
                we = Signal(name=f"wr_{block.name}_{r.name}_we")
                m.d.sync += we.eq(g_load & (aw_addr[2:group_bits] == _group_word(block, r)))
                if r.access in ("rw", "wo"):
                    port = getattr(getattr(self, block.name), r.name)
                    with m.If(we):
                        m.d.sync += port.eq(self._merge_lanes(port, g_data, g_strb))
                elif r.access == "command":
                    port = getattr(getattr(self, block.name), r.name)
                    stb = getattr(getattr(self, block.name), f"{r.name}_stb")
                    with m.If(we):
                        m.d.sync += [
                            port.eq(self._merge_lanes(Const(0, r.width), g_data, g_strb)),
                            stb.eq(1),
                        ]
                elif r.access == "clear":
                    m.d.comb += clears[block.name].eq(we & g_strb[0] & g_data[0])

        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(do_write):
            m.d.sync += [aw_full.eq(0), w_full.eq(0)]
        with m.If(wpend):  # after the line above: a new response replaces the one just taken
            m.d.sync += [bus.bvalid.eq(1), bus.bresp.eq(resp_r)]

        # --- counters --------------------------------------------------------------------
        # The counts live in a small RAM (LUT RAM: 32 bits x one word per counter), not in a
        # 32-bit register and adder per counter. Written by hand: no library has a counter
        # bank, and this one must keep the register semantics exactly (a read returns the
        # count of the clock after its AR handshake; a clear keeps the event of its clock).
        # Each counter has a short pending count ``p`` and a "cleared" flag ``z``; a flush
        # walks the counters round robin, one a clock: it takes a counter's ``p`` and ``z``
        # (they restart from this clock's increment and 0), reads its RAM word, and a clock
        # later writes ``(0 if z else word) + p`` back. A counter is flushed every ``n``
        # clocks, so ``p`` never exceeds ``n``. A read adds the counter's ``p`` to its RAM
        # word (or to the write in flight, if the flush of that counter is between its two
        # clocks), or returns ``p`` alone while ``z`` is set. The register map's 63 counters
        # were each 33 flip-flops and a 32-bit carry chain, and each word fed the read
        # multiplexers (ECPIX-5 routing, README board notes); now each is a few flip-flops and
        # an incrementer, and one RAM read port serves every counter read.
        # The increment and the clear are registered first (so nothing of the bus decode sits
        # in front of the counting logic); both take effect one clock later than they would
        # unregistered and stay aligned, so clearing and counting in the same clock still
        # keeps the event.
        clears_r = {}
        for block_name, clear in clears.items():
            clears_r[block_name] = Signal(name=f"{block_name}_clear_r")
            m.d.sync += clears_r[block_name].eq(clear)
        if c_list:
            n = max(2, len(c_list))                     # the flush period, clocks
            # In LUT RAM, not block RAM: the boards' block RAMs are all taken, and a block
            # RAM would pull the bank to a block RAM row.
            c_mem = Memory(shape=32, depth=n, init=[0] * n, attrs={"ram_style": "distributed"})
            m.submodules.counter_mem = c_mem
            f_rd = c_mem.read_port(domain="comb")       # the flush's read
            h_rd = c_mem.read_port(domain="comb")       # the host's read
            c_wr = c_mem.write_port()
            ring = Signal(n, init=1)                    # one-hot: the counter flushed now
            f_idx = Signal(range(n))
            m.d.sync += [ring.eq(ring.rotate_left(1)),
                         f_idx.eq(Mux(f_idx == n - 1, 0, f_idx + 1))]
            m.d.comb += f_rd.addr.eq(f_idx)
            pend, zero = [], []
            for i, (block, r) in enumerate(c_list):
                inc = getattr(getattr(self, block.name), f"{r.name}_inc")
                inc_r = Signal(name=f"{block.name}_{r.name}_inc_r")
                p = Signal(range(n + 1), name=f"{block.name}_{r.name}_pend")
                # Set at reset, so that a reset (not only configuration) zeroes the counts.
                z = Signal(init=1, name=f"{block.name}_{r.name}_zero")
                clear = clears_r[block.name]
                m.d.sync += [
                    inc_r.eq(inc),
                    p.eq(Mux(ring[i] | clear, inc_r, p + inc_r)),
                    z.eq(clear | (z & ~ring[i])),
                ]
                pend.append(p)
                zero.append(z)
            # The flush in flight: taken at the last edge, written at the next one.
            s1_valid = Signal()
            s1_idx = Signal(range(n))
            s1_word = Signal(32)
            s1_pend = Signal(range(n + 1))
            s1_zero = Signal()
            m.d.sync += [s1_valid.eq(1), s1_idx.eq(f_idx), s1_word.eq(f_rd.data),
                         s1_pend.eq(_or_all(Mux(ring[i], pend[i], 0) for i in range(len(c_list)))),
                         s1_zero.eq(_or_all(ring[i] & zero[i] for i in range(len(c_list))))]
            s1_sum = Signal(32)
            m.d.comb += [s1_sum.eq(Mux(s1_zero, 0, s1_word) + s1_pend),
                         c_wr.en.eq(s1_valid), c_wr.addr.eq(s1_idx), c_wr.data.eq(s1_sum)]

        # --- read path -------------------------------------------------------------------
        # Timing: the read is registered in three steps, so no path is wider than one group of
        # registers. The groups are the BLOCK_SIZE windows of the map (one per block here, at
        # most 64 words each). (1) At the AR handshake each group registers whether the read is
        # for it and, if so, the word address inside it (else 0): only a group compare sits
        # behind the bus inputs (address decode plus the 32-bit mux from them took 8.1 ns on a
        # speed-6 ECP5). (2) In the clock after it every group muxes its word by its own address
        # copy into a 32-bit register, with a hit bit set only in the addressed group and only
        # for a mapped word. (3) A clock later rdata is the OR of the groups' words gated by
        # their hit bits, OKAY if any hit. One Switch over all 289 registers, as it was, did not
        # route at 125 MHz on an ECP5 (every register bit fanned into one 289-way mux feeding
        # rdata); one shared address register for the group muxes routed at 125.7 MHz, its
        # fan-out to all of them being the worst path; a copy per group 155.5 MHz. The registers
        # are sampled in the same clock as before; only rvalid comes a clock later. No read has
        # a side effect, so nothing else has to move with it.
        # (4) A clock after that, rdata: the counters' read-back needs a clock more (below), so
        # the groups' OR is registered in (3) and joined with the counter's word in (4).
        # Step (2) is itself two registered steps: eight registers at a time by the word
        # address's low bits, then by its high bits. As one 64-way multiplexer per group, from
        # the address copy through registers all over the die into the group's word, it was
        # -3.12 ns routed on the ECPIX-5 core at a30d177 (seed 1, a 3.8 ns congestion detour).
        ar_full = Signal()      # step 2a in this clock
        mid_full = Signal()     # step 2b in this clock
        sel_full = Signal()     # step 3 in this clock
        fin_full = Signal()     # step 4 in this clock
        ar_take = Signal()
        m.d.comb += [
            bus.arready.eq(~bus.rvalid & ~ar_full & ~mid_full & ~sel_full & ~fin_full
                           & ~scrubbing),
            ar_take.eq(bus.arvalid & bus.arready),
        ]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(ar_take):
            m.d.sync += ar_full.eq(1)
        with m.If(ar_full):
            m.d.sync += [mid_full.eq(1), ar_full.eq(0)]
        with m.If(mid_full):
            m.d.sync += [sel_full.eq(1), mid_full.eq(0)]
        with m.If(sel_full):
            m.d.sync += [fin_full.eq(1), sel_full.eq(0)]
        with m.If(fin_full):
            m.d.sync += [bus.rvalid.eq(1), fin_full.eq(0)]

        words, hits = [], []
        for g, regs in sorted(groups.items()):
            # The copy is 0 unless the read is for this group, so the copies differ and Yosys
            # does not merge them back into one register.
            sel = Signal(name=f"rd_group{g:x}_sel")
            addr = Signal(group_bits - 2, name=f"rd_group{g:x}_addr")
            with m.If(ar_take):
                m.d.sync += [
                    sel.eq(bus.araddr[group_bits:] == g),
                    addr.eq(Mux(bus.araddr[group_bits:] == g, bus.araddr[2:group_bits], 0)),
                ]
            word = Signal(32, name=f"rd_group{g:x}_data")
            hit = Signal(name=f"rd_group{g:x}_hit")
            # They load in every clock without an enable: sel and addr hold still from the AR
            # handshake until the read is answered, so in the clock with sel_full they hold the
            # registers as sampled in the clock with ar_full.
            if g in shadows:
                _wp, rp, _rw = shadows[g]
                m.d.comb += rp.addr.eq(addr)
            n_sub = max(1, -(-(1 << (group_bits - 2)) // 8))
            sub_words = [Signal(32, name=f"rd_group{g:x}_sub{j}") for j in range(n_sub)]
            sub_hits = [Signal(name=f"rd_group{g:x}_sub{j}_hit") for j in range(n_sub)]
            for j in range(n_sub):
                m.d.sync += [sub_words[j].eq(0), sub_hits[j].eq(0)]
                with m.Switch(addr[:3]):
                    for block, r in regs:
                        if _group_word(block, r) >> 3 != j:
                            continue
                        with m.Case(_group_word(block, r) & 7):
                            value = (rp.data if g in shadows and r.access == "rw"
                                     else self._read_value(block, r))
                            m.d.sync += [sub_words[j].eq(value), sub_hits[j].eq(sel)]
            m.d.sync += [word.eq(Array(sub_words)[addr[3:]]), hit.eq(Array(sub_hits)[addr[3:]])]
            words.append(word)
            hits.append(hit)
        if c_list:
            # Counters: their group's word is 0 and its hit marks the address as mapped; the
            # count comes from here. (1) At the AR handshake the counter's index; (2) in the
            # clock after, its RAM word (or the flush write in flight for it), pending count
            # and cleared flag, registered; (3) their sum, into rdata with the groups' words.
            c_sel = Signal()
            c_idx = Signal(range(n))
            c_sel_d = Signal()
            with m.If(ar_take):
                m.d.sync += [c_sel.eq(0), c_idx.eq(0)]
                with m.Switch(bus.araddr[2:self._addr_width]):
                    for i, (block, r) in enumerate(c_list):
                        with m.Case((block.base + r.offset) >> 2):
                            m.d.sync += [c_sel.eq(1), c_idx.eq(i)]
            # The pending counts and cleared flags (one per counter, each by its own block)
            # are selected in two registered steps: eight at a time by the index's low bits in
            # (2), then by its high bits in (3). As one 63-way multiplexer in (2), from the
            # index register across the die to p_r, it was 12.95 ns routed on the ECPIX-5 core
            # at 245eb29 (seed 1), a 5.5 ns congestion detour in it. Every register here loads
            # in every clock: c_idx holds still from the AR handshake until the read is
            # answered, so (3) holds (2)'s samples and (4) (3)'s.
            lo = 3
            n_sub = -(-len(c_list) // (1 << lo))
            p_sub = [Signal(range(n + 1), name=f"c_pend_sub{j}") for j in range(n_sub)]
            z_sub = [Signal(name=f"c_zero_sub{j}") for j in range(n_sub)]
            for j in range(n_sub):
                m.d.sync += [p_sub[j].eq(0), z_sub[j].eq(0)]
                with m.Switch(c_idx[:lo]):
                    for k in range(1 << lo):
                        i = (j << lo) + k
                        if i < len(c_list):
                            with m.Case(k):
                                m.d.sync += [p_sub[j].eq(pend[i]), z_sub[j].eq(zero[i])]
            x_r = Signal(32)
            x_rr = Signal(32)
            p_r = Signal(range(n + 1))
            z_r = Signal()
            c_sel_dd = Signal()
            m.d.comb += h_rd.addr.eq(c_idx)
            m.d.sync += [
                x_r.eq(Mux(s1_valid & (s1_idx == c_idx), s1_sum, h_rd.data)),
                c_sel_d.eq(c_sel),
                x_rr.eq(x_r), c_sel_dd.eq(c_sel_d),
                p_r.eq(Array(p_sub)[c_idx[lo:]]), z_r.eq(Array(z_sub)[c_idx[lo:]]),
            ]
        g_word = Signal(32)
        g_hit = Signal()
        with m.If(sel_full):
            m.d.sync += [
                g_word.eq(_or_all(Mux(hit, word, 0) for hit, word in zip(hits, words, strict=True))),
                g_hit.eq(_or_all(hits)),
            ]
        r_word, r_hit = g_word, g_hit
        if c_list:
            # The counter's word, registered beside the groups' OR (step 3): x_rr, p_r and z_r
            # hold the samples of the clock after the AR handshake only in that clock.
            c_word = Signal(32)
            c_hit = Signal()
            with m.If(sel_full):
                m.d.sync += [c_word.eq(Mux(c_sel_dd, Mux(z_r, 0, x_rr) + p_r, 0)),
                             c_hit.eq(c_sel_dd)]
            r_word = g_word | c_word
            r_hit = g_hit | c_hit
        with m.If(fin_full):
            m.d.sync += [
                bus.rdata.eq(r_word),
                bus.rresp.eq(Mux(r_hit, Resp.OKAY, Resp.SLVERR)),
            ]

        return m

    def _read_value(self, block, r):
        if r.access in ("counter", "clear", "command", "wo"):   # a counter: from the counter RAM
            return Const(0, 32)
        if r.const:
            return Const(r.init, 32)
        return getattr(getattr(self, block.name), r.name)  # ro input or rw output port

    @staticmethod
    def _merge_lanes(current, data, strb):
        """``current`` with the byte lanes selected by ``strb`` replaced from ``data``."""
        width = len(current)
        padded = Cat(current, Const(0, 32 - width))
        lanes = [Mux(strb[i], data[8 * i:8 * i + 8], padded[8 * i:8 * i + 8])
                 for i in range((width + 7) // 8)]
        return Cat(*lanes)[:width]
