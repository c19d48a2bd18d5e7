"""Formal: the MR check never allows an access outside [base, base+length), across tenants or
protection domains, with a stale key, or beyond the rights of the region.

Bounded model check (``stellar.sim.formal.prove``, yowasp-sby with z3) of ``MrProtection``
(4 entries, 4 pages, 1 checker): the host port and the check port are driven by the solver with
any value in every clock (``AnySeq``), so entries are written with arbitrary contents at
arbitrary times, also in the very clock a check reads them. An ``AnyConst`` index I is tracked:
a shadow register follows every write of entry I, and each check of a key with index I carries,
down a delay line of ``LATENCY`` stages, the entry it read (the shadow including a write in the
same clock: the check port is transparent to the host's writes). When the answer comes out:

- allowed with a non-zero length => the entry is valid, its tag is the key's, its tenant and PD
  are the request's, it grants every requested right, and ``entry.va <= va`` and
  ``va + length <= entry.va + entry.length`` in 65-bit arithmetic (no wrap-around);
- allowed with a non-zero length and a contiguous region => ``bus_addr = bus_base + (va -
  entry.va)`` modulo 2**64;
- allowed with a non-zero length => the key's index is inside the table;
- denied => ``bus_addr`` and ``span`` are 0 (a denial never carries an address).

Depth 9 (steps 0-8): reset is step 0, so the earliest entry write and a check of it in the same
clock (the transparent path) are step 1, answered at step 1 + ``LATENCY`` = 7; a check in step 2
reads the entry from the memory itself (not the bypass) and is answered at step 8, and the
command port, busy for ``LATENCY`` cycles after that write, takes a second write of the same
entry at step 7 while that check is in flight. Every behaviour of the check is a function of one
entry (as read in the request's clock) and one request: the checker keeps no other state than
its ``LATENCY`` pipeline stages, and the page table only feeds the page-list bus address, which
no property constrains. A longer trace only lets the entry hold a value that one write at step 1
can give it as well, so a longer trace adds no new case (depth 7 was the same argument at
``LATENCY`` = 4 and depth 8 at 5; each register stage that made it 5, then 6 (the entry's read
data registered) added one step to every case).
``test_mr_check_covers`` shows, within the depth, allowed answers through the bypass and through
the memory, contiguous and page list, and one with a second write of the entry in flight, so the
assertions are not vacuous; ``test_mr_planted_bug_fails`` shows a cross-tenant leak is caught.

Engine: ``smtbmc --syn z3`` (``ENGINE``): smtbmc first synthesizes the model to gates, which
z3 solves faster here than the word-level model (measured: 136 s CPU against 167 s at depth 7).
The sizes (4 entries, 4 pages, one checker) are the smallest that keep an untracked entry
beside the tracked one and a page-table row beyond the first; the datapath widths (64-bit va,
32-bit length) are fixed by ``MR_ENTRY`` and not parameters of the RTL, so they stay as built.
"""

from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Cover, Elaboratable, Module, Mux, ResetSignal, Signal
from stellar.hdl.flow.fields import KEY_TAG_BITS
from stellar.hdl.flow.layouts import mr_entry_layout
from stellar.hdl.flow.mr import MrOp, MrProtection, check_layout
from stellar.sim.formal import prove

ENTRIES = 4
PAGES = 4
DEPTH = 9
ENGINE = "smtbmc --syn z3"


class MrHarness(Elaboratable):
    """``MrProtection`` under an arbitrary environment, with the safety properties above.

    ``leak``: a planted bug between the checker and the properties -- requests of tenant 0xA5
    are reported allowed -- that the properties must catch.
    """

    def __init__(self, *, leak=False, cover=False):
        self.leak = leak
        self.cover = cover

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = MrProtection(ENTRIES, PAGES)
        L = dut.LATENCY
        cmd, chk, res = dut.cmd, dut.check[0], dut.result[0]
        # Nothing is offered while reset is high: a memory keeps a write made during reset, the
        # registers of this harness would not.
        m.d.comb += [
            cmd.valid.eq(AnySeq(1) & ~ResetSignal()),
            cmd.payload.eq(AnySeq(len(cmd.payload.as_value()))),
            chk.valid.eq(AnySeq(1) & ~ResetSignal()),
            chk.payload.eq(AnySeq(len(chk.payload.as_value()))),
        ]

        tracked = AnyConst(range(ENTRIES))
        shadow = Signal(mr_entry_layout())
        writes = Signal()
        m.d.comb += writes.eq(cmd.valid & cmd.ready & (cmd.payload.op == MrOp.WRITE_ENTRY)
                              & (cmd.payload.index == tracked))
        with m.If(writes):
            m.d.sync += shadow.eq(cmd.payload.data)
        seen = Signal(mr_entry_layout())
        m.d.comb += seen.eq(Mux(writes, cmd.payload.data, shadow))

        # The request and the entry it read, LATENCY cycles down a delay line.
        req = Signal(check_layout())
        ent = Signal(mr_entry_layout())
        valid = Signal()
        # For the covers: the entry came through the bypass (written in the request's clock),
        # and entry I was written again while the request was in flight.
        bypassed, rewritten = Signal(), Signal()
        prev_req, prev_ent, prev_valid = chk.payload, seen, chk.valid
        prev_byp, prev_rw = writes, 0
        for i in range(L):
            r, e, v = Signal(check_layout(), name=f"req{i}"), Signal(mr_entry_layout(), name=f"ent{i}"), \
                Signal(name=f"valid{i}")
            b, w = Signal(name=f"bypassed{i}"), Signal(name=f"rewritten{i}")
            m.d.sync += [r.eq(prev_req), e.eq(prev_ent), v.eq(prev_valid), b.eq(prev_byp),
                         w.eq(prev_rw | (writes if i else 0))]
            prev_req, prev_ent, prev_valid, prev_byp, prev_rw = r, e, v, b, w
        m.d.comb += [req.eq(prev_req), ent.eq(prev_ent), valid.eq(prev_valid),
                     bypassed.eq(prev_byp), rewritten.eq(prev_rw)]

        allowed = Signal()
        m.d.comb += allowed.eq(res.payload.allowed | (self.leak & (req.tenant == 0xA5)))
        index = Signal(32 - KEY_TAG_BITS)
        m.d.comb += index.eq(req.key[KEY_TAG_BITS:])
        granted = Signal()
        m.d.comb += granted.eq(valid & res.valid & allowed & (req.length != 0))

        m.d.comb += Assert(res.valid == valid, "a result for every request, LATENCY later")
        with m.If(granted):
            m.d.comb += Assert(index < ENTRIES, "allowed key indexes inside the table")
        with m.If(granted & (index == tracked)):
            m.d.comb += [
                Assert(ent.valid, "allowed only through a valid entry"),
                Assert(ent.tag == req.key[:KEY_TAG_BITS], "allowed only with the entry's key tag"),
                Assert(ent.tenant == req.tenant, "never across tenants"),
                Assert(ent.pd == req.pd, "never across protection domains"),
                Assert((req.access & ~ent.access) == 0, "never beyond the region's rights"),
                Assert(ent.va <= req.va, "never below the region's base"),
                Assert(req.va + req.length <= ent.va + ent.length, "never past the region's end"),
            ]
            with m.If(~ent.page_list):
                m.d.comb += Assert(res.payload.bus_addr == (ent.bus_base + req.va - ent.va)[:64],
                                   "contiguous: bus address = bus_base + offset")
        with m.If(res.valid & ~res.payload.allowed):
            m.d.comb += Assert((res.payload.bus_addr == 0) & (res.payload.span == 0),
                               "a denial carries no address")
        if self.cover:
            tracked_grant = Signal()
            m.d.comb += tracked_grant.eq(granted & (index == tracked))
            m.d.comb += [
                Cover(tracked_grant & ~ent.page_list & bypassed),
                Cover(tracked_grant & ~ent.page_list & ~bypassed),
                Cover(tracked_grant & ent.page_list),
                Cover(tracked_grant & ~bypassed & rewritten),
            ]
        return m


def test_mr_check_bmc():
    prove("mr_check", MrHarness(), depth=DEPTH, engine=ENGINE)


def test_mr_check_covers():
    prove("mr_check_cover", MrHarness(cover=True), depth=DEPTH, mode="cover", engine=ENGINE)


def test_mr_planted_bug_fails():
    try:
        prove("mr_check_bug_leak", MrHarness(leak=True), depth=DEPTH, engine=ENGINE)
    except AssertionError as e:
        assert "failed" in str(e)
    else:
        raise AssertionError("a cross-tenant leak passed the MR properties")
