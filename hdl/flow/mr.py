# Ref: IBTA Vol 1 ch. 10.6 (memory regions, L_Key/R_Key, access rights), ch. 9.7 (responder
#      R_Key / bounds checks of RDMA and atomic requests); rdma-core libibverbs/verbs.h (access flags)
"""Memory-region (MR) protection: the MR table and the key / PD / access / bounds check that
guards every DMA.

Every remote access a packet names (RDMA WRITE/READ RETH, AtomicETH) and every local buffer of a
work request is checked here before any DMA happens. The table holds ``entries`` MR entries
(``fields.MR_ENTRY``, one memory word each) and a page table of ``pages`` 64-bit page bus
addresses for page-list MRs, both in block RAM. Each check port answers one request per clock,
``LATENCY`` cycles later, with ``allowed`` and the bus address, or a reason.

Check semantics (``MrReason``; the first failing check, in this order, names the answer):
  length == 0   allowed, ``OK``, ``span`` 0, ``bus_addr`` 0: IBTA does not validate the key of a
                zero-length transfer, and no DMA happens.
  BAD_KEY       ``index = key >> 8`` is ``>= entries``, the entry is not valid, or its tag is
                not ``key & 0xFF`` (a stale key of a re-registered entry).
  PD_TENANT     the entry's tenant or protection domain differs from the request's.
  ACCESS        a requested flag is not granted: ``access & ~entry.access != 0``. A local read
                asks for no flag (``access = 0``) and is always granted (IB semantics).
  BOUNDS        not ``entry.va <= va and va + length <= entry.va + entry.length``, computed on
                65 bits (no wrap-around at 2**64); for a page-list MR also a page-table row
                ``pbl_index + page >= pages`` (the table is never read outside).
Allowed (``length > 0``):
  contiguous MR  ``bus_addr = entry.bus_base + (va - entry.va)`` (mod 2**64), ``span = length``.
  page-list MR   page size ``P = 1 << page_shift``; ``page = (va - entry.va + (entry.va & (P-1)))
                 >> page_shift``; ``bus_addr`` is ``page_table[pbl_index + page]`` with its low
                 ``page_shift`` bits replaced by ``va & (P-1)``; ``span = min(length, P - (va &
                 (P-1)))``: the DMA engine asks again for the rest, one page at a time.
Denied: ``allowed = 0``, ``bus_addr = 0``, ``span = 0`` -- a denied answer never carries an
address. While ``result.valid`` is low the whole result payload is 0.

Consistency: an entry is one memory word, written at once, so a check sees the old or the new
entry, never a mix. The check read ports are transparent to the command write port (a check in
the same cycle as the write sees the new entry; Yosys adds the bypass, since a block RAM's
cross-port collision is undefined). Page-table edits are the host's to order: edit the pages of
an MR only while no valid entry refers to them, i.e. write the pages, then the entry that makes
the MR valid; to retire it, invalidate the entry and wait for that command's ``resp`` before
reusing its pages. ``resp`` comes ``LATENCY`` cycles after a command was taken, when every check
that may have seen the old entry has answered, so no check mixes an old entry with new pages.

Ports (``N = checkers``; ``check`` and ``result`` are arrays: ``check[0]`` .. ``check[N-1]``,
each ``result[n]`` answering ``check[n]``):
  ``check[n]``   in   ``stream.Signature(check_layout(tag_bits), always_ready=True)``:
                      ``tenant`` 8, ``pd`` 16, ``key`` 32, ``va`` 64, ``length`` 32, ``access`` 4
                      (``Access`` flags requested), ``tag`` ``tag_bits`` (carried to the result).
  ``result[n]``  out  ``stream.Signature(result_layout(tag_bits), always_ready=True)``:
                      ``allowed`` 1, ``reason`` 3 (``MrReason``), ``bus_addr`` 64, ``span`` 32,
                      ``tag`` ``tag_bits``; valid exactly ``LATENCY`` cycles after the request.
  ``cmd``        in   ``stream.Signature(cmd_layout())``: ``op`` 2 (``MrOp``), ``index`` 16,
                      ``data`` ``MR_ENTRY.width`` (a page in bits 63:0). Ready when idle:
                      after a command is taken ``cmd.ready`` is low until the cycle of its
                      ``resp`` (one command per ``LATENCY`` cycles).
  ``resp``       out  ``stream.Signature(resp_layout(), always_ready=True)``: a one-cycle pulse
                      ``LATENCY`` cycles after a command was taken; ``data``: the entry or
                      the page (zero-extended) read, 0 for writes. An index beyond the table
                      reads as 0 and its writes are ignored.

Parameters: ``entries`` (power of two, <= 65536), ``pages`` (1 .. 65536; page-table index
width 16), ``checkers`` (independent check ports), ``tag_bits`` (width of the request tag).
Latency: ``LATENCY = 6`` cycles (entry read; entry registered; checks and page offset; page
index and bounds; verdict and page-table read; registered answer), one request per clock per
port. (5 until the entry read data got a register of its own, with no logic in front of it.)

Block RAM: each check port has its own read port of the entry and page memories; the command
port has one read and one write port of each, on the same address, so Yosys maps them onto one
port of the true dual-port RAM (ECP5 DP16KD): with one checker each memory is one set of block
RAMs; every further checker adds a copy.
"""

import enum

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .fields import KEY_TAG_BITS, MR_ENTRY, PD_BITS, TENANT_BITS, MrReason
from .layouts import mr_entry_layout

__all__ = ["MrOp", "MrProtection", "check_layout", "result_layout", "cmd_layout", "resp_layout"]

PAGE_BITS = 64          # one page-table entry: the bus address of a page
INDEX_BITS = 16         # command index (entries and pages), and pbl_index
SHIFT_MAX = (1 << MR_ENTRY["page_shift"].width) - 1     # largest page_shift: pages up to 2 GiB


class MrOp(enum.IntEnum):
    """Command of the ``cmd`` port."""
    READ_ENTRY = 0
    WRITE_ENTRY = 1
    READ_PAGE = 2
    WRITE_PAGE = 3


def check_layout(tag_bits=0):
    return data.StructLayout({"tenant": TENANT_BITS, "pd": PD_BITS, "key": 32, "va": 64,
                              "length": 32, "access": MR_ENTRY["access"].width, "tag": tag_bits})


def result_layout(tag_bits=0):
    return data.StructLayout({"allowed": 1, "reason": 3, "bus_addr": 64, "span": 32,
                              "tag": tag_bits})


def cmd_layout():
    return data.StructLayout({"op": 2, "index": INDEX_BITS, "data": MR_ENTRY.width})


def resp_layout():
    return data.StructLayout({"data": MR_ENTRY.width})


def _below(index, n):
    """``index < n``; for a power of two n, as "the bits from log2(n) up are zero" (a few LUTs)
    rather than a carry chain: Yosys keeps the chain, and on the command's take into the write
    enables and the read ports' bypass registers it was -1.38 ns routed on the ECPIX-5 core at
    ec958a5."""
    if n & (n - 1) == 0:
        b = (n - 1).bit_length()
        return index[b:] == 0
    return index < n


class MrProtection(wiring.Component):
    """The MR table and its check pipelines; see the module docstring for ports and semantics."""

    LATENCY = 6

    def __init__(self, entries=1024, pages=1024, *, checkers=1, tag_bits=0):
        assert 1 <= entries <= 1 << INDEX_BITS and entries & (entries - 1) == 0, entries
        assert 1 <= pages <= 1 << INDEX_BITS, pages
        assert checkers >= 1 and tag_bits >= 0
        self.entries = entries
        self.pages = pages
        self.checkers = checkers
        self.tag_bits = tag_bits
        super().__init__({
            "check":  In(stream.Signature(check_layout(tag_bits), always_ready=True)).array(checkers),
            "result": Out(stream.Signature(result_layout(tag_bits), always_ready=True)).array(checkers),
            "cmd":    In(stream.Signature(cmd_layout())),
            "resp":   Out(stream.Signature(resp_layout(), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.entry_mem = entry_mem = Memory(shape=mr_entry_layout(), depth=self.entries,
                                                    init=[])
        m.submodules.page_mem = page_mem = Memory(shape=PAGE_BITS, depth=self.pages, init=[])
        entry_w = entry_mem.write_port()
        page_w = page_mem.write_port()

        self._command(m, entry_mem, entry_w, page_mem, page_w)
        for n in range(self.checkers):
            # Transparent to the host's writes: Yosys builds the bypass, so a check that collides
            # with a write gets the whole new word (a block RAM's cross-port collision is not
            # defined and could give a mix of old and new bits, RAM by RAM).
            self._checker(m, n, entry_mem.read_port(transparent_for=(entry_w,)),
                          page_mem.read_port(transparent_for=(page_w,)))
        return m

    # ------------------------------------------------------------------------------ host port
    def _command(self, m, entry_mem, entry_w, page_mem, page_w):
        cmd, resp = self.cmd, self.resp
        entry_r = entry_mem.read_port()
        page_r = page_mem.read_port()

        # A command is taken when idle, and answered LATENCY cycles later: by then every check
        # issued before an entry write has answered (see the module docstring).
        busy = Signal(range(self.LATENCY + 1))
        take = Signal()
        in_entries = Signal()
        in_pages = Signal()
        m.d.comb += [
            cmd.ready.eq(busy == 0),
            take.eq(cmd.valid & cmd.ready),
            in_entries.eq(_below(cmd.payload.index, self.entries)),
            in_pages.eq(_below(cmd.payload.index, self.pages)),
        ]
        # One address for the read and the write port of each memory: one RAM port.
        entry_addr = Signal(range(self.entries))
        page_addr = Signal(range(self.pages))
        m.d.comb += [
            entry_addr.eq(cmd.payload.index),
            page_addr.eq(cmd.payload.index),
            entry_r.addr.eq(entry_addr),
            entry_w.addr.eq(entry_addr),
            entry_w.data.eq(cmd.payload.data),
            entry_w.en.eq(take & in_entries & (cmd.payload.op == MrOp.WRITE_ENTRY)),
            entry_r.en.eq(take & (cmd.payload.op == MrOp.READ_ENTRY)),
            page_r.addr.eq(page_addr),
            page_w.addr.eq(page_addr),
            page_w.data.eq(cmd.payload.data[:PAGE_BITS]),
            page_w.en.eq(take & in_pages & (cmd.payload.op == MrOp.WRITE_PAGE)),
            page_r.en.eq(take & (cmd.payload.op == MrOp.READ_PAGE)),
        ]
        # What the answer holds, decided when the command is taken; the read ports keep their
        # data (en low) until it leaves.
        src = Signal(2)     # 0: zero, 1: entry read port, 2: page read port
        with m.If(take):
            m.d.sync += busy.eq(self.LATENCY - 1)
            with m.Switch(cmd.payload.op):
                with m.Case(MrOp.READ_ENTRY):
                    m.d.sync += src.eq(Mux(in_entries, 1, 0))
                with m.Case(MrOp.READ_PAGE):
                    m.d.sync += src.eq(Mux(in_pages, 2, 0))
                with m.Default():
                    m.d.sync += src.eq(0)
        with m.Elif(busy != 0):
            m.d.sync += busy.eq(busy - 1)
        # busy counts LATENCY-1 .. 1 after the command, resp is the cycle busy reaches 0.
        answer = Signal()
        m.d.sync += answer.eq(0)
        with m.If(busy == 1):
            m.d.sync += answer.eq(1)
        m.d.comb += resp.valid.eq(answer)
        with m.If(answer):
            with m.Switch(src):
                with m.Case(1):
                    m.d.comb += resp.payload.data.eq(entry_r.data)
                with m.Case(2):
                    m.d.comb += resp.payload.data.eq(page_r.data)

    # ------------------------------------------------------------------------------ check port
    def _checker(self, m, n, entry_r, page_r):
        req, res = self.check[n], self.result[n]
        ab = (self.entries - 1).bit_length()            # entry address bits
        pab = (self.pages - 1).bit_length()             # page address bits
        tb = self.tag_bits

        def sig(name, shape, **kw):
            return Signal(shape, name=f"c{n}_{name}", **kw)

        # ---- stage 0 (request cycle): read the entry the key names.
        index = sig("index", 32 - KEY_TAG_BITS)
        m.d.comb += [
            index.eq(req.payload.key[KEY_TAG_BITS:]),
            entry_r.addr.eq(index[:ab]),
        ]
        s1_valid = sig("s1_valid", 1)
        s1 = sig("s1", check_layout(tb))
        s1_key_oob = sig("s1_key_oob", 1)      # index >= entries: the entry read is a wrong one
        m.d.sync += [
            s1_valid.eq(req.valid),
            s1.eq(req.payload),
            s1_key_oob.eq(index[ab:] != 0),
        ]

        # ---- stage 1: the entry is out of the RAM and registered as it leaves, with nothing on
        # the way (a DP16KD output, 1.42 ns clock-to-out, then a long net: entry RAM -> page
        # mask -> 64-bit subtract into ``from_page`` was -1.38 ns on 60 endpoints routed on the
        # ECPIX-5 core at e7458bf; this stage made ``LATENCY`` 6).
        e = sig("entry", mr_entry_layout())
        s1r_valid = sig("s1r_valid", 1)
        s1r = sig("s1r", check_layout(tb))
        s1r_key_oob = sig("s1r_key_oob", 1)
        m.d.sync += [
            e.eq(entry_r.data),
            s1r_valid.eq(s1_valid),
            s1r.eq(s1),
            s1r_key_oob.eq(s1_key_oob),
        ]
        s1, s1_valid, s1_key_oob = s1r, s1r_valid, s1r_key_oob

        # ---- stage 2 (the registers ``s2_*`` it fills keep their names): the cheap checks and
        # every wide difference and sum that needs the entry, each on its own carry chain (one
        # per signal, in parallel).
        shift = e.page_shift
        mask = sig("mask", 32)          # P - 1 (page_shift <= 31)
        # A table of constants (each bit one 5-input function of the shift), not 32 compares:
        # yosys maps ``i < shift`` to a carry chain each, a level more on the RAM's output.
        with m.Switch(shift):
            for i in range(SHIFT_MAX + 1):
                with m.Case(i):
                    m.d.comb += mask.eq((1 << i) - 1)
        lo_diff = sig("lo_diff", 65)    # va - entry.va; bit 64: va < entry.va
        req_end = sig("req_end", 65)    # va + length, without wrap
        mr_end = sig("mr_end", 65)      # entry.va + entry.length, without wrap
        from_page = sig("from_page", 64)  # va - (entry.va rounded down to a page): page offset
        m.d.comb += [
            lo_diff.eq(Cat(s1.va, Const(0, 1)) - Cat(e.va, Const(0, 1))),
            req_end.eq(s1.va + s1.length),
            mr_end.eq(e.va + e.length),
            from_page.eq(s1.va - (e.va & ~Cat(mask, Const(0, 32)))),
        ]

        s2 = {name: sig(f"s2_{name}", shape) for name, shape in [
            ("valid", 1), ("zero", 1), ("key_ok", 1), ("pdt_ok", 1), ("acc_ok", 1), ("lo_ok", 1),
            ("req_end", 65), ("mr_end", 65), ("off", 64), ("from_page", 64), ("bus_base", 64),
            ("page_list", 1), ("pbl_index", INDEX_BITS), ("pg_lim", INDEX_BITS + 1),
            ("shift", 5), ("mask", 32),
            ("va_low", 32), ("room", 33), ("length", 32), ("tag", tb)]}
        m.d.sync += [
            s2["valid"].eq(s1_valid),
            s2["zero"].eq(s1.length == 0),
            s2["key_ok"].eq(~s1_key_oob & e.valid & (e.tag == s1.key[:KEY_TAG_BITS])),
            s2["pdt_ok"].eq((e.tenant == s1.tenant) & (e.pd == s1.pd)),
            s2["acc_ok"].eq((s1.access & ~e.access) == 0),
            s2["lo_ok"].eq(~lo_diff[64]),
            s2["req_end"].eq(req_end),
            s2["mr_end"].eq(mr_end),
            s2["off"].eq(lo_diff[:64]),
            s2["from_page"].eq(from_page),
            s2["bus_base"].eq(e.bus_base),
            s2["page_list"].eq(e.page_list),
            s2["pbl_index"].eq(e.pbl_index),
            # Pages from pbl_index to the end of the table (0 if it starts past it): the bound
            # of the page index, so that stage 3 compares the shifted offset with it directly
            # rather than after adding pbl_index (two carry chains in a row behind the shift:
            # -1.03 ns into ``s3_page_ok`` routed on the ECPIX-5 core at e7458bf).
            s2["pg_lim"].eq(Mux(e.pbl_index < self.pages, self.pages - e.pbl_index, 0)),
            s2["shift"].eq(shift),
            s2["mask"].eq(mask),
            s2["va_low"].eq(s1.va[:32] & mask),
            # P - (va & (P-1)) = ((P-1) & ~va) + 1: no borrow, one short increment.
            s2["room"].eq((mask & ~s1.va[:32]) + 1),
            s2["length"].eq(s1.length),
            s2["tag"].eq(s1.tag),
        ]

        # ---- stage 3 (registers ``s3_*``): the page index (page offset >> page shift, plus the
        # page-list row) and every comparison that needs a carry chain; registered, so that the
        # verdict of the next stage is a few LUTs of registered flags.
        page = sig("page", 64)
        pidx = sig("pidx", INDEX_BITS + 1)
        page_in = sig("page_in", 1)     # pbl_index + page < pages, i.e. page < pg_lim
        page_ok = sig("page_ok", 1)
        m.d.comb += [
            page.eq(s2["from_page"] >> s2["shift"]),
            pidx.eq(s2["pbl_index"] + page[:INDEX_BITS]),
            page_in.eq(page[:INDEX_BITS] < s2["pg_lim"]),
            page_ok.eq((page[INDEX_BITS:] == 0) & page_in),
        ]
        row = sig("row", max(pab, 1))   # the page-table row to read (never past the last row)
        if self.pages == 1 << pab:
            m.d.comb += row.eq(pidx[:pab])
        else:
            m.d.comb += row.eq(Mux(page_in, pidx[:pab], 0))

        s3 = {name: sig(f"s3_{name}", shape) for name, shape in [
            ("valid", 1), ("zero", 1), ("key_ok", 1), ("pdt_ok", 1), ("acc_ok", 1),
            ("lo_ok", 1), ("hi_ok", 1), ("page_ok", 1), ("row", max(pab, 1)), ("bus_contig", 64),
            ("page_list", 1), ("room_short", 1), ("room", 33), ("length", 32), ("mask", 32), ("va_low", 32),
            ("tag", tb)]}
        m.d.sync += [
            s3["valid"].eq(s2["valid"]),
            s3["zero"].eq(s2["zero"]),
            s3["key_ok"].eq(s2["key_ok"]),
            s3["pdt_ok"].eq(s2["pdt_ok"]),
            s3["acc_ok"].eq(s2["acc_ok"]),
            s3["lo_ok"].eq(s2["lo_ok"]),
            s3["hi_ok"].eq(s2["req_end"] <= s2["mr_end"]),
            s3["page_ok"].eq(~s2["page_list"] | page_ok),
            s3["row"].eq(row),
            s3["bus_contig"].eq(s2["bus_base"] + s2["off"]),
            s3["page_list"].eq(s2["page_list"]),
            s3["room_short"].eq(s2["room"] < s2["length"]),
            s3["room"].eq(s2["room"]),
            s3["length"].eq(s2["length"]),
            s3["mask"].eq(s2["mask"]),
            s3["va_low"].eq(s2["va_low"]),
            s3["tag"].eq(s2["tag"]),
        ]

        # ---- stage 4 (registers ``s4_*``): the answer is decided; the page-table read.
        m.d.comb += page_r.addr.eq(s3["row"])
        reason = sig("reason", 3)
        with m.If(s3["zero"]):
            m.d.comb += reason.eq(MrReason.OK)
        with m.Elif(~s3["key_ok"]):
            m.d.comb += reason.eq(MrReason.BAD_KEY)
        with m.Elif(~s3["pdt_ok"]):
            m.d.comb += reason.eq(MrReason.PD_TENANT)
        with m.Elif(~s3["acc_ok"]):
            m.d.comb += reason.eq(MrReason.ACCESS)
        with m.Elif(~(s3["lo_ok"] & s3["hi_ok"] & s3["page_ok"])):
            m.d.comb += reason.eq(MrReason.BOUNDS)
        with m.Else():
            m.d.comb += reason.eq(MrReason.OK)
        # moves: an allowed transfer of at least one byte (the only answer with an address).
        moves = sig("moves", 1)
        m.d.comb += moves.eq(s3["valid"] & ~s3["zero"] & (reason == MrReason.OK))
        span = sig("span", 32)
        with m.If(moves):
            with m.If(s3["page_list"] & s3["room_short"]):
                m.d.comb += span.eq(s3["room"])
            with m.Else():
                m.d.comb += span.eq(s3["length"])

        s4 = {name: sig(f"s4_{name}", shape) for name, shape in [
            ("valid", 1), ("allowed", 1), ("reason", 3), ("span", 32), ("use_page", 1),
            ("bus_contig", 64), ("mask", 32), ("va_low", 32), ("tag", tb)]}
        m.d.sync += [
            s4["valid"].eq(s3["valid"]),
            s4["allowed"].eq(s3["valid"] & (reason == MrReason.OK)),
            s4["reason"].eq(Mux(s3["valid"], reason, 0)),
            s4["span"].eq(span),
            s4["use_page"].eq(moves & s3["page_list"]),
            s4["bus_contig"].eq(Mux(moves & ~s3["page_list"], s3["bus_contig"], 0)),
            s4["mask"].eq(s3["mask"]),
            s4["va_low"].eq(s3["va_low"]),
            s4["tag"].eq(Mux(s3["valid"], s3["tag"], 0)),
        ]

        # ---- stage 5: the page's bus address with the offset in the page; registered answer.
        page_addr = sig("page_addr", 64)
        m.d.comb += page_addr.eq(Cat((page_r.data[:32] & ~s4["mask"]) | s4["va_low"],
                                     page_r.data[32:]))
        m.d.sync += [
            res.valid.eq(s4["valid"]),
            res.payload.allowed.eq(s4["allowed"]),
            res.payload.reason.eq(s4["reason"]),
            res.payload.bus_addr.eq(Mux(s4["use_page"], page_addr, s4["bus_contig"])),
            res.payload.span.eq(s4["span"]),
            res.payload.tag.eq(s4["tag"]),
        ]
