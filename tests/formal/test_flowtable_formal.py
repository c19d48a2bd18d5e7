"""Formal (bounded) proofs of the flow table, ``stellar.hdl.flow.cuckoo.FlowTable``, and tests of
the proof runner ``stellar.sim.formal`` itself.

The property: the lookup port never returns a QP index whose stored key differs from the query,
and never misses a stored key -- in every cycle, also while a command moves entries around.
Tracked-key technique: the solver picks any key ``K`` and value ``V`` (``AnyConst``) and drives
every input freely (``AnySeq``: a lookup per cycle of any key, any command sequence with any
gaps). A shadow bit ``present`` follows the observed protocol (INSERT of ``K`` answered OK sets
it, DELETE of ``K`` answered OK clears it); the environment inserts ``K`` only with value ``V``
and every other key with a value other than ``V``. Asserted:

1. a lookup of ``K`` presented while no command on ``K`` is in progress (in progress: from the
   cycle the command transfers up to and including its resp cycle) returns, ``LATENCY`` cycles
   later, ``hit == present`` (as it was at presentation) and ``value == V`` on a hit. ``K`` is
   any key, so this is the no-false-hit / no-missed-hit property for every key;
2. a lookup of any key ``Q != K`` never returns ``(hit, V)``, not even during a command on ``K``
   (``V`` belongs to ``K`` alone): no lookup returns another key's QP, in any cycle;
3. every response to a command on ``K`` is the one the spec demands from ``present``: INSERT ->
   EXISTS with ``V`` if present, else OK or FULL; DELETE -> OK / NOT_FOUND; LOOKUP -> OK with
   ``V`` / NOT_FOUND. FULL leaves ``present`` unchanged by construction, so (1) checks that a
   FULL insert (walk and undo) leaves ``K`` exactly where it was;
4. protocol: ``result.valid`` is ``lookup.valid`` delayed by ``LATENCY``; ``cmd.ready == ~busy``;
   a ``resp`` only for a command in progress; ``occupancy`` equals the OK inserts minus the OK
   deletes whenever the table is idle; no command runs longer than ``longest_command``.

The block RAM read of a slot that the manager writes in the same cycle is undefined on an FPGA;
the harness replaces it with free data (``AnySeq``), so a design that used such a read fails.

Configuration and depth. 16 slots in 2 ways of 8 (the smallest capacity the table accepts),
stash 1, ``max_kicks`` 1. Three simplifications keep z3 within about two minutes:

- the ways' hashes are replaced by slices of the key bits (``SliceHash``). The correctness
  argument of the table (its docstring: invariants I1-I3) holds for any hash functions, so this
  loses nothing about the manager and the lookup pipeline, and lets the solver make keys collide
  by plain bit equality; the tabulation hash itself is tested against its Python twin in
  ``tests/unit/test_flowhash.py``;
- a trace uses ``KEYS`` distinct keys (all ``AnyConst``, K among them) with ``KEY_BITS`` free
  low bits: more than a 12-cycle trace can insert, and enough to share both slots of a key;
- ``DEPTH`` = 12 cycles (steps 0-11): the reset cycle, two inserts into empty slots (3 cycles
  each, transfer included, when the solver puts the key on the port a clock before the transfer;
  otherwise the table re-reads, 3 cycles more, and both ways are proved), and a third insert
  that evicts (PROBE, CHECK, WRITE, LATCH: the walk of ``max_kicks`` = 1 eviction, ending in an
  empty slot or the stash, 5 cycles), answered in step 11, so its response, the occupancy after
  it and every lookup presented up to step 7 (while slots are written, with the ``mask`` path)
  are checked; ``longest_command`` (10 cycles, a FULL insert with its undo) is asserted for
  every command that starts in the trace. What this depth does NOT check: a lookup of ``K``
  presented while ``K`` sits in the manager's ``old``/``cur`` registers. The cover test reaches
  such a presentation first in step 10, so its result (``LATENCY`` later, step 14) lies beyond
  the trace; checking it needs depth 15, several times the cost below. The register comparisons
  are exercised by the cocotb stress test instead.

Engine and cost: ``smtbmc --syn z3`` (``ENGINE``; smtbmc synthesizes the model to gates first),
which z3 solves in about half the CPU time of the word-level model at this depth (measured: 289
s CPU against 542 s; one step more costs about 3x). The FULL path (walk, stash full, undo: 23
cycles from reset at ``max_kicks`` 1) is far beyond a test's budget.
It is covered by the cocotb stress test (``tests/cocotb/test_flowtable_stress.py``, thousands of FULL
answers checked against the model with a lookup every cycle) and the unit tests, not here. The
cover test shows the depth is not vacuous: within it the solver reaches an insert that evicts
(answered OK in the last step) and the presentation of a lookup of ``K`` while ``K`` is moving.
"""

import pytest
from amaranth.asserts import AnyConst, AnySeq, Initial
from amaranth.hdl import Array, Assert, Assume, Cover, Elaboratable, Module, Mux, Signal
from stellar.hdl.flow.fields import FlowOp, FlowStatus
from stellar.sim.formal import prove

CONFIG = {"capacity": 16, "ways": 2, "stash": 1, "max_kicks": 1}
KEYS = 5          # distinct keys a trace uses (K among them)
KEY_BITS = 8      # the keys' free low bits (the upper ones are 0)
DEPTH = 12
ENGINE = "smtbmc --syn z3"


def longest_command(max_kicks, stash, **_):
    """Cycles from a command's transfer to its resp at most (``FlowTable`` docstring): a FULL
    insert is PROBE, CHECK, ``max_kicks`` evictions of WRITE+LATCH, UNDO_READ and ``max_kicks``
    UNDO_LATCH+UNDO_WRITE; a DELETE re-homes each stash entry with PROBE, CHECK and a walk.
    Plus 3 (CHECK, REREAD, PROBE) for a command whose key was not on the port the clock before
    its transfer."""
    full_insert = 3 + 4 * max_kicks + 3
    delete = 2 + stash * (2 + 2 * max_kicks) + 3
    return max(full_insert, delete)


class FlowTableHarness(Elaboratable):
    """``dut`` (a FlowTable with ``tag_bits=0``) with free inputs and the properties above.

    ``lookup_key_bug``: a planted bug for the tests -- the key given to the table's lookup port
    has bit 0 cleared (a comparison that ignores a bit). ``late_result``: another one -- the
    result is observed one cycle late.
    """

    def __init__(self, dut, *, keys=6, key_bits=32, lookup_key_bug=False, late_result=False,
                 covers=False):
        self.dut = dut
        self.keys = keys
        self.key_bits = key_bits
        self.lookup_key_bug = lookup_key_bug
        self.late_result = late_result
        self.covers = covers

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        L, V_BITS = dut.LATENCY, dut.value_bits
        # The keys of the trace: K (tracked) and a few more, all chosen by the solver.
        keys = [Signal(32, name=f"key{i}") for i in range(self.keys)]
        m.d.comb += [key.eq(AnyConst(32)) for key in keys]
        if self.key_bits < 32:
            m.d.comb += [Assume(key[self.key_bits:] == 0) for key in keys]
        k = keys[0]
        v = Signal(V_BITS, name="V")
        m.d.comb += v.eq(AnyConst(V_BITS))
        first = Signal()
        m.d.comb += first.eq(Initial())

        # -- free inputs: any of the keys, any value, any op, any timing ------------------------
        lk_valid, lk_key = Signal(), Signal(32)
        c_valid, c_op, c_key, c_val = Signal(), Signal(2), Signal(32), Signal(V_BITS)
        lk_sel, c_sel = Signal(range(self.keys)), Signal(range(self.keys))
        m.d.comb += [lk_valid.eq(AnySeq(1)), lk_sel.eq(AnySeq(len(lk_sel))), c_valid.eq(AnySeq(1)),
                     c_op.eq(AnySeq(2)), c_sel.eq(AnySeq(len(c_sel))), c_val.eq(AnySeq(V_BITS))]
        m.d.comb += [Assume(lk_sel < self.keys), Assume(c_sel < self.keys)]
        m.d.comb += [lk_key.eq(Array(keys)[lk_sel]), c_key.eq(Array(keys)[c_sel])]
        m.d.comb += [
            dut.lookup.valid.eq(lk_valid),
            dut.lookup.payload.key.eq(lk_key & 0xFFFF_FFFE if self.lookup_key_bug else lk_key),
            dut.cmd.valid.eq(c_valid),
            dut.cmd.payload.op.eq(c_op),
            dut.cmd.payload.key.eq(c_key),
            dut.cmd.payload.value.eq(c_val),
        ]
        # Environment: nothing during the reset cycle; a stream source holds an offered command
        # until it is taken; K is inserted only with V, every other key with another value.
        m.d.comb += Assume(~first | (~lk_valid & ~c_valid))
        prev_stalled = Signal()
        prev_op, prev_key, prev_val = Signal(2), Signal(32), Signal(V_BITS)
        m.d.sync += [prev_stalled.eq(c_valid & ~dut.cmd.ready), prev_op.eq(c_op), prev_key.eq(c_key),
                     prev_val.eq(c_val)]
        with m.If(prev_stalled):
            m.d.comb += Assume(c_valid & (c_op == prev_op) & (c_key == prev_key) & (c_val == prev_val))
        with m.If(c_valid & (c_op == FlowOp.INSERT)):
            m.d.comb += Assume((c_key == k) == (c_val == v))

        # -- shadow of the command protocol ------------------------------------------------------
        take = Signal()
        m.d.comb += take.eq(c_valid & dut.cmd.ready)
        inflight = Signal()
        f_op, f_key = Signal(2), Signal(32)
        f_cycles = Signal(range(1 << 8))
        present = Signal()
        count = Signal(V_BITS + 2)
        resp = dut.resp
        status = resp.payload.status
        with m.If(take):
            m.d.sync += [inflight.eq(1), f_op.eq(c_op), f_key.eq(c_key), f_cycles.eq(0)]
        with m.Elif(inflight & (f_cycles != (1 << 8) - 1)):
            m.d.sync += f_cycles.eq(f_cycles + 1)
        with m.If(resp.valid):
            m.d.sync += inflight.eq(0)
            with m.If((f_op == FlowOp.INSERT) & (status == FlowStatus.OK)):
                m.d.sync += count.eq(count + 1)
            with m.If((f_op == FlowOp.DELETE) & (status == FlowStatus.OK)):
                m.d.sync += count.eq(count - 1)
            with m.If(f_key == k):
                with m.If((f_op == FlowOp.INSERT) & (status == FlowStatus.OK)):
                    m.d.sync += present.eq(1)
                with m.If((f_op == FlowOp.DELETE) & (status == FlowStatus.OK)):
                    m.d.sync += present.eq(0)

        # (3) the answers about K.
        with m.If(resp.valid & (f_key == k)):
            with m.Switch(f_op):
                with m.Case(FlowOp.INSERT):
                    m.d.comb += Assert(Mux(present,
                                           (status == FlowStatus.EXISTS) & (resp.payload.value == v),
                                           (status == FlowStatus.OK) | (status == FlowStatus.FULL)))
                with m.Case(FlowOp.DELETE):
                    m.d.comb += Assert(status == Mux(present, FlowStatus.OK, FlowStatus.NOT_FOUND))
                with m.Case(FlowOp.LOOKUP):
                    m.d.comb += Assert(Mux(present,
                                           (status == FlowStatus.OK) & (resp.payload.value == v),
                                           status == FlowStatus.NOT_FOUND))
        # (4) protocol.
        m.d.comb += [
            Assert(dut.cmd.ready == ~dut.busy),
            Assert(~resp.valid | inflight),
            Assert(~inflight | (f_cycles < longest_command(dut.max_kicks, dut.stash))),
        ]
        with m.If(~dut.busy & ~first):
            m.d.comb += Assert(dut.occupancy == count)

        # -- lookups: a pipeline of what each lookup must return --------------------------------
        k_busy = Signal()      # a command on K is in progress this cycle (transfer .. resp)
        m.d.comb += k_busy.eq((take & (c_key == k)) | (inflight & (f_key == k)))
        pipe = []
        prev = (lk_valid, lk_key == k, ~k_busy, present)
        for i in range(L):
            stage = (Signal(name=f"p{i}_valid"), Signal(name=f"p{i}_is_k"), Signal(name=f"p{i}_clean"),
                     Signal(name=f"p{i}_present"))
            m.d.sync += [s.eq(p) for s, p in zip(stage, prev, strict=True)]
            pipe.append(stage)
            prev = stage
        p_valid, p_is_k, p_clean, p_present = pipe[-1]

        r = dut.result
        r_valid, r_hit, r_value = Signal(), Signal(), Signal(V_BITS)
        if self.late_result:
            m.d.sync += [r_valid.eq(r.valid), r_hit.eq(r.payload.hit), r_value.eq(r.payload.value)]
        else:
            m.d.comb += [r_valid.eq(r.valid), r_hit.eq(r.payload.hit), r_value.eq(r.payload.value)]
        # (4) exactly LATENCY cycles.
        m.d.comb += Assert(r_valid == p_valid)
        with m.If(r_valid & p_is_k & p_clean):
            # (1) hit == present, value == V on a hit.
            m.d.comb += Assert(r_hit == p_present)
            m.d.comb += Assert(~r_hit | (r_value == v))
        with m.If(r_valid & ~p_is_k):
            # (2) V is K's alone.
            m.d.comb += Assert(~r_hit | (r_value != v))

        if self.covers:
            k_moving = Signal()
            m.d.comb += k_moving.eq((dut._old_vis & (dut._old_key == k))
                                    | (dut._cur_vis & (dut._cur_key == k)))
            m.d.comb += [
                # A lookup of stored K presented while K sits in a manager register (moving).
                Cover(k_moving & lk_valid & (lk_key == k) & ~k_busy & present),
                # An insert walk (an eviction: the answer takes more than PROBE + CHECK).
                Cover(resp.valid & (f_op == FlowOp.INSERT) & (status == FlowStatus.OK) & (f_cycles > 2)),
            ]
        return m


class CollisionJunk:
    """Mixin over FlowTable: a lookup read of the slot the manager writes in the same cycle
    returns free data (the block RAM's read-during-write across ports is undefined)."""

    def _lookup_read(self, m, way, port, write_port):
        collided = Signal(name=f"f_collide{way}")
        m.d.sync += collided.eq(port.en & write_port.en & (port.addr == write_port.addr))
        junk = Signal(port.data.shape(), name=f"f_junk{way}")
        m.d.comb += junk.as_value().eq(AnySeq(len(port.data.as_value())))
        out = Signal(port.data.shape(), name=f"f_read{way}")
        m.d.comb += out.as_value().eq(Mux(collided, junk.as_value(), port.data.as_value()))
        return out


class SliceHash:
    """Way ``w``'s slot address = key bits ``[w * bits, (w + 1) * bits)``: hash collisions are
    plain bit equalities for the solver (see the module docstring for why this is sound)."""

    def __init__(self, way, bits):
        self.lo, self.bits = way * bits, bits

    def __call__(self, key):
        return (int(key) >> self.lo) & ((1 << self.bits) - 1)

    def gateware(self, key):
        return key[self.lo:self.lo + self.bits]


def make_table(junk=True, **kw):
    from stellar.hdl.flow.cuckoo import FlowTable

    class Table(*((CollisionJunk,) if junk else ()), FlowTable):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.hashes = [SliceHash(w, self.addr_bits) for w in range(self.ways)]

    return Table(**{**CONFIG, **kw}, tag_bits=0)


def harness(**kw):
    return FlowTableHarness(make_table(), keys=KEYS, key_bits=KEY_BITS, **kw)


def test_flowtable_lookup_bmc():
    """Properties (1)-(4) hold for every trace of ``DEPTH`` cycles from reset (see the module
    docstring for the choice of depth)."""
    prove("flowtable_lookup", harness(), depth=DEPTH, engine=ENGINE)


def test_flowtable_covers():
    """The proof is not vacuous: within ``DEPTH`` cycles the solver reaches a lookup of ``K`` while
    ``K`` sits in a manager register (an eviction walk moving it) and an insert that evicts."""
    prove("flowtable_cover", harness(covers=True), depth=DEPTH, mode="cover", engine=ENGINE)


@pytest.mark.parametrize("bug", ["lookup_key_bug", "late_result"])
def test_flowtable_planted_bug_fails(bug):
    """Each planted bug gives a counterexample: the properties can fail."""
    with pytest.raises(AssertionError, match="Assert failed"):
        prove(f"flowtable_bug_{bug}", harness(**{bug: True}), depth=DEPTH, engine=ENGINE)


# -- the runner itself ---------------------------------------------------------------------------

class Counter(Elaboratable):
    """Counts 0..9 and wraps; ``limit=10`` is the planted bug (it reaches 10)."""

    def __init__(self, limit=9):
        self.limit = limit

    def elaborate(self, platform):
        m = Module()
        c = Signal(4)
        with m.If(c == self.limit):
            m.d.sync += c.eq(0)
        with m.Else():
            m.d.sync += c.eq(c + 1)
        m.d.comb += Assert(c < 10, "counter below 10")
        m.d.comb += Cover(c == 9)
        return m


def test_runner_passes_a_right_design():
    prove("runner_ok", Counter(), depth=25)
    prove("runner_ok_induction", Counter(), depth=4, mode="prove")
    prove("runner_ok_cover", Counter(), depth=12, mode="cover")


def test_runner_fails_a_wrong_design():
    with pytest.raises(AssertionError) as info:
        prove("runner_bug", Counter(limit=10), depth=25)
    text = str(info.value)
    assert "Assert failed" in text and "counter below 10" in text, text
    assert "trace.vcd" in text
    trace = next(line for line in text.splitlines() if line.startswith("counterexample trace:"))
    from pathlib import Path
    assert Path(trace.split(": ", 1)[1]).is_file()


def test_runner_fails_an_unreachable_cover():
    with pytest.raises(AssertionError, match="FAIL"):
        prove("runner_cover_short", Counter(), depth=5, mode="cover")


def test_runner_reset_first_cycle():
    """``reset="first"``: ``rst`` is high in the first cycle only, so a design that counts its
    resets never sees a second one (with ``reset="free"`` it does)."""

    class Resets(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            from amaranth.hdl import ResetSignal
            seen = Signal(2, reset_less=True)
            with m.If(ResetSignal()):
                m.d.sync += seen.eq(seen + 1)
            m.d.comb += Assert(seen <= 1)
            return m

    prove("runner_reset_first", Resets(), depth=10)
    with pytest.raises(AssertionError, match="Assert failed"):
        prove("runner_reset_free", Resets(), depth=10, reset="free")
