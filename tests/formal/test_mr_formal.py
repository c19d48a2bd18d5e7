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

Depth 8: reset (1) + an entry write (1) + a check of it (``LATENCY`` 4 to the answer) is 6
cycles; 8 also holds a check issued in the very clock of the write, and a second write of the
same entry while the first check is in flight. Every behaviour of the check is a function of one
entry and one request plus at most ``LATENCY`` cycles of history (the checker has no other
state), so longer traces add nothing new.
``test_mr_check_covers`` shows allowed answers (contiguous and page list) are reachable
within that depth, so the assertions are not vacuous; ``test_mr_planted_bug_fails`` shows a
cross-tenant leak is caught.
"""

from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Cover, Elaboratable, Module, Mux, ResetSignal, Signal
from stellar.hdl.flow.fields import KEY_TAG_BITS
from stellar.hdl.flow.layouts import mr_entry_layout
from stellar.hdl.flow.mr import MrOp, MrProtection, check_layout
from stellar.sim.formal import prove

ENTRIES = 4
PAGES = 4
DEPTH = 8


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
        prev_req, prev_ent, prev_valid = chk.payload, seen, chk.valid
        for i in range(L):
            r, e, v = Signal(check_layout(), name=f"req{i}"), Signal(mr_entry_layout(), name=f"ent{i}"), \
                Signal(name=f"valid{i}")
            m.d.sync += [r.eq(prev_req), e.eq(prev_ent), v.eq(prev_valid)]
            prev_req, prev_ent, prev_valid = r, e, v
        m.d.comb += [req.eq(prev_req), ent.eq(prev_ent), valid.eq(prev_valid)]

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
                Cover(tracked_grant & ~ent.page_list),
                Cover(tracked_grant & ent.page_list),
            ]
        return m


def test_mr_check_bmc():
    prove("mr_check", MrHarness(), depth=DEPTH)


def test_mr_check_covers():
    prove("mr_check_cover", MrHarness(cover=True), depth=DEPTH, mode="cover")


def test_mr_planted_bug_fails():
    try:
        prove("mr_check_bug_leak", MrHarness(leak=True), depth=DEPTH)
    except AssertionError as e:
        assert "failed" in str(e)
    else:
        raise AssertionError("a cross-tenant leak passed the MR properties")
