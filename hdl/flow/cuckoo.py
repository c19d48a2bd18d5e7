# Ref: R. Pagh, F. F. Rodler, "Cuckoo hashing", J. Algorithms 51 (2004); A. Kirsch, M. Mitzenmacher,
#      U. Wieder, "More robust hashing: cuckoo hashing with a stash", SIAM J. Comput. 39 (2009);
#      A. Frieze, P. Melsted, M. Mitzenmacher, "An analysis of random-walk cuckoo hashing" (2011)
"""Exact-match flow table: (tenant, QPN) -> QP index, a d-ary cuckoo hash table with a stash.

The table is ``ways`` block RAMs of ``capacity // ways`` slots, one entry per slot
(``valid``, 32-bit key, ``value_bits`` value). Key ``k`` may live in way ``w`` only at address
``h_w(k)`` (tabulation hashes, ``stellar.hdl.flow.hash``), or in the ``stash``: a few entries in
registers, compared in parallel. A lookup reads the key's slot in every way at once and compares
them and the stash, so the lookup port takes one key per clock at a fixed latency, with no
backpressure. The host inserts and deletes through a command port; inserts move entries
(random-walk cuckoo) while lookups keep flowing.

Ports:
  ``lookup``      in   stream (always ready): ``key`` (``flow_key_layout()``) and ``tag``
                       (``tag_bits``, carried to the result). One lookup per clock.
  ``result``      out  stream (always ready): ``hit``, ``value`` (``value_bits``, 0 on a miss),
                       ``tag``. Valid exactly ``LATENCY`` (4) cycles after its lookup.
  ``cmd``         in   stream: ``op`` (``FlowOp``, 2 bits), ``key``, ``value``. Ready while idle.
                       A source that puts the key on the port a clock before it raises
                       ``valid`` gets the cycle counts below; otherwise every command takes 3
                       cycles more (``RxFlowPipeline`` at 937a2ea raises ``valid`` with the
                       payload: its commands take 5 cycles, not 2).
  ``resp``        out  stream (always ready), a one-cycle pulse when a command completes:
                       ``status`` (``FlowStatus``), ``value`` (stored value: LOOKUP hit or
                       EXISTS), ``cycles`` (clocks from the ``cmd`` transfer to this pulse,
                       saturating at 65535).
  ``busy``        out  a command is executing (``cmd.ready == ~busy``).
  ``occupancy``   out  keys stored, table and stash (``value_bits + 1`` bits).
  ``stash_used``  out  stash entries in use.

Parameters: ``capacity`` (slots, a power of two >= 16, divisible by ``ways`` into a power-of-two
depth of at least 2), ``ways`` (>= 2), ``stash`` (entries, >= 0), ``tag_bits`` (>= 0),
``max_kicks`` (evictions an insert may make before it gives up, >= 1), ``seed`` (hash matrices
and the victim generator). ``value_bits = max(1, ceil(log2(capacity)))``.

Commands:
  INSERT  key present (table or stash): EXISTS with the stored value, nothing changes.
          Else an empty slot among the key's ways: written there. Else a random walk: evict the
          occupant of one of the carried key's ways (pseudo-random, never the way the carried
          key was just evicted from), place the carried key there, carry the evictee; before
          each eviction all the carried key's other ways are read, and an empty one ends the
          walk. After ``max_kicks`` evictions the homeless key goes to the stash; with the stash
          full, the walk is undone in reverse and the answer is FULL with the table exactly as
          before. OK otherwise.
  DELETE  OK (slot or stash entry invalidated) or NOT_FOUND. When a table slot was freed and the
          stash holds keys, each stash entry is then given one walk back into the table (at
          most ``max_kicks`` evictions; if that walk ends homeless the homeless key takes the
          stash entry's place, so no undo is needed), stopping at the first that lands. The
          response comes after that: the stash stays as empty as possible.
  LOOKUP  OK and the value, or NOT_FOUND.  NOP: OK.
  Cycles (``resp.cycles``): 2 for LOOKUP, DELETE, EXISTS and an INSERT into an empty slot;
  ``2 + 2 n`` for an insert that made n evictions (into the stash: ``2 + 2 max_kicks``);
  ``3 + 4 max_kicks`` for FULL (the walk and its undo). A DELETE that re-homes stash entries
  adds ``2 + 2 n`` per attempt. The next command may be taken the cycle after ``resp``.
  All of these when the command's key was on ``cmd`` in the clock before its transfer (the
  payload of a command that waited for ``ready`` is); if not, 3 more (CHECK finds that IDLE read
  the slots of another key: REREAD, PROBE, CHECK again).

Lookup pipeline (``LATENCY`` = 4; a lookup presented in cycle t):
  stage 0 (cycle t)    hash the key for every way; register key, tag and addresses.
  stage 1 (cycle t+1)  the lookup read port of every way reads the key's slot. In the SAME cycle
                       the key is compared with every register that can hold a stored key (the
                       stash entries and the manager's two in-flight registers ``cur`` and
                       ``old``) and with the key of an insert in progress (``hide``, below), and
                       each way notes whether the manager writes the very slot being read
                       (``mask``). These comparisons are registered, with a copy of each
                       compared register's value.
  stage 2 (cycle t+2)  every way's read data is registered as it leaves the block RAM (no
                       logic on it: the block RAMs' outputs are slow and far apart), with the
                       stage-1 results: the register hits merged into one hit and value, both
                       cleared by ``hide``; ``mask`` and ``hide`` folded into one enable per way.
  stage 3 (cycle t+3)  each way's slot (unless masked) is compared with the key; the hit is
                       the OR of the way hits and the register hit; registered onto
                       ``result`` (valid in cycle t+4). Until ec958a5 this compare worked on
                       the block RAM outputs directly (``LATENCY`` 3).

Why a lookup never misses a stored key nor hits a wrong one. Let ``M_c`` be the memory contents
in cycle c (writes take effect at the end of their cycle) and ``R_c`` the set of registered
entries (stash, ``cur``, ``old``) in cycle c. The manager keeps this invariant for every stored
key other than the key of the command in progress, in every cycle c:

  (I1) the key is in ``M_c`` at ``h_w(key)`` of some way w, or in ``R_c``, with its value;
  (I2) a slot the manager writes in cycle c held either nothing, or a key that is in ``R_c``;
       and the key it writes is in ``R_c`` too (the manager only ever writes from ``cur``).
  (I3) no key is anywhere with a wrong value, and the registers only hold stored keys (or the
       command's own key, which is the one allowed ambiguity).

Stage 1 reads the memory in cycle c (the read returns ``M_c`` for a slot not written in cycle c)
and compares the registers of the same cycle c, so the lookup sees the pair (``M_c``, ``R_c``).
By (I1) the key is in one of them. If it is in the memory at a slot written in cycle c, the read
result is undefined (ECP5 block RAM read-during-write across ports), but that way is masked and,
by (I2), the key is also in ``R_c``. A masked way only ever hides keys that (I2) places in
``R_c``, and an unmasked read is exactly ``M_c``, so there is no false hit (I3). No register is
compared one cycle late: that is why the comparisons are made in stage 1 and not with the
memory data in stage 3 (a key could move from a register into a slot between two cycles and be
missed by both); registering the read data in stage 2 changes nothing here, the data is
``M_c`` either way. The write that finishes a move and the register update that forgets the
moved key happen at the same clock edge, so every cycle sees the key in one place or the other.

How the manager keeps (I2): an eviction takes two cycles, LATCH then WRITE. In LATCH the
occupant of the chosen slot (read the cycle before) is copied into ``old``; in WRITE ``cur`` is
written over that slot while both ``cur`` and ``old`` hold the two keys, and at the end of WRITE
``old`` moves into ``cur``. While WRITE writes one way, the other ways' ports read the new
carried key's slots (its address is hashed from ``old``), so LATCH already sees them and an
empty one ends the walk with a write of ``cur`` into an empty slot (nothing is overwritten).
The undo replays the recorded ways backwards with the same LATCH/WRITE pair (the address of a
step is the hash of the key carried back, so only the way of each step is recorded; consecutive
steps use different ways, so the read of the next step shares the cycle of the write).

Manager timing: no path runs from a way's read data through a key comparison to the next read
address, and none from the ``cmd`` port through a hash: the key on ``cmd`` is registered every
clock as it is (``pre_key``), and IDLE reads the slots of that register's key, hashed from it --
the key offered on ``cmd`` when the source put it there a clock before the transfer (PROBE
registers whether it did, ``stale``; if not, CHECK sends the command through REREAD, which reads
the right slots, and PROBE again). PROBE reads the same slots again for CHECK and registers the
comparisons of the carried key with that first read and with the stash (``t_hit``, ``s_hit``:
nothing is written between the two reads, and ``cur`` and the stash do not change in PROBE), so
CHECK decides from registers. LATCH and UNDO_LATCH only look at the ``valid`` bits and copy a
slot into ``old``. Each stash entry keeps its key's slot addresses (taken from ``cur_addr`` when
``cur`` goes to the stash), so starting a re-home walk selects registers and hashes nothing.
Registers whose contents matter only after one outcome of CHECK or LATCH are loaded whatever the
outcome (``old``'s key and value, the stash entry that would take a homeless key, ``cur`` for
the next re-home): only a few control bits wait for the read data. The cycle counts above are
unchanged by this.

The key under INSERT is never visible before the answer: while a walk carries it, a lookup of
exactly that key is forced to miss (``hide``, compared in stage 1 like the registers), so a FULL
insert is never seen at all, an insert walk that succeeds becomes visible with the response, and
an insert into an empty slot is written in the cycle of its response. A DELETE invalidates the
slot in the cycle of its response. Lookups presented after the response cycle see the new state.

Block RAM ports: each way's memory has exactly one read port for lookups and one read port and
one write port for the manager, the last two always at the same address (yosys maps them to one
read/write port of a true-dual-port block RAM, e.g. ECP5 DP16KD, without duplicating the memory).
The lookup read port is declared transparent to the manager's write port although its result
on that collision is never used (masked, above): Amaranth has no "undefined on collision"
setting, and its non-transparent default promises the old data, which the two ports of an ECP5
block RAM cannot give, so yosys duplicated every memory to keep that promise (24 DP16KD instead
of 12 at capacity 4096). Transparency it can meet without a second copy.
"""

import random

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .fields import FLOW_KEY, FlowOp, FlowStatus
from .hash import addr_bits_of, flow_hashes
from .layouts import flow_key_layout

__all__ = ["FlowTable"]

KEY_BITS = FLOW_KEY.width


def _any(signals):
    return Cat(*signals).any() if signals else Const(0)


def _or_values(pairs, width):
    """OR of ``value`` over the ``(hit, value)`` pairs whose hit is set (the hits agree)."""
    out = Const(0, width)
    for hit, value in pairs:
        out = out | Mux(hit, value, 0)
    return out


class FlowTable(wiring.Component):
    LATENCY = 4

    def __init__(self, capacity=4096, *, ways=4, stash=4, tag_bits=0, max_kicks=128, seed=0):
        if capacity < 16 or capacity & (capacity - 1):
            raise ValueError(f"capacity {capacity} must be a power of two >= 16")
        if ways < 2 or capacity % ways or capacity // ways < 2:
            raise ValueError(f"ways {ways} must be >= 2 and divide capacity {capacity}")
        if stash < 0 or tag_bits < 0 or max_kicks < 1:
            raise ValueError("stash and tag_bits must be >= 0, max_kicks >= 1")
        self.capacity = capacity
        self.ways = ways
        self.stash = stash
        self.tag_bits = tag_bits
        self.max_kicks = max_kicks
        self.seed = seed
        self.depth = capacity // ways
        self.addr_bits = addr_bits_of(capacity, ways)
        self.value_bits = max(1, (capacity - 1).bit_length())
        self.hashes = flow_hashes(capacity, ways, seed)
        V = self.value_bits
        self.entry_layout = data.StructLayout({"valid": 1, "key": flow_key_layout(), "value": V})
        super().__init__({
            "lookup": In(stream.Signature(
                data.StructLayout({"key": flow_key_layout(), "tag": tag_bits}), always_ready=True)),
            "result": Out(stream.Signature(
                data.StructLayout({"hit": 1, "value": V, "tag": tag_bits}), always_ready=True)),
            "cmd": In(stream.Signature(
                data.StructLayout({"op": 2, "key": flow_key_layout(), "value": V}))),
            "resp": Out(stream.Signature(
                data.StructLayout({"status": 2, "value": V, "cycles": 16}), always_ready=True)),
            "busy": Out(1),
            "occupancy": Out(V + 1),
            "stash_used": Out(range(stash + 1)),
        })
        # The manager's registers that can hold stored keys (named here so tests can watch them).
        self._cur_key = Signal(KEY_BITS)         # the carried entry
        self._cur_val = Signal(V)
        self._cur_vis = Signal()                 # compared by lookups
        self._old_key = Signal(KEY_BITS)         # the occupant about to be overwritten
        self._old_val = Signal(V)
        self._old_vis = Signal()
        self._st_valid = Signal(max(stash, 1))
        self._st_key = [Signal(KEY_BITS, name=f"st_key{i}") for i in range(stash)]
        self._st_val = [Signal(V, name=f"st_val{i}") for i in range(stash)]
        self._hide = Signal()                    # an insert walk carries cmd_key: lookups miss it
        self._cmd_key = Signal(KEY_BITS)
        # Lookup stage 1, for tests that check coverage of the move cycles.
        self._s1_valid = Signal()
        self._s1_key = Signal(KEY_BITS)
        self._s1_mask = Signal(ways)             # the manager writes the slot being read

    def _lookup_read(self, m, way, port, write_port):
        """The data of way ``way``'s lookup read port as stage 2 registers it. A seam for tests:
        they override it to model the undefined result of a read of the slot written in the same
        cycle (``write_port``), which the design must never use."""
        return port.data

    def elaborate(self, platform):
        m = Module()
        W, A, V, S = self.ways, self.addr_bits, self.value_bits, self.stash
        T = self.tag_bits
        E = self.entry_layout
        K = self.max_kicks

        # -- memories: one per way; lookup read port + manager read/write at one address --------
        lk_rd, mg_rd, mg_wr = [], [], []
        for w in range(W):
            mem = Memory(shape=E, depth=self.depth, init=[])
            m.submodules[f"way{w}"] = mem
            wr = mem.write_port()
            mg_rd.append(mem.read_port(domain="sync"))
            lk_rd.append(mem.read_port(domain="sync", transparent_for=(wr,)))
            mg_wr.append(wr)

        def hash_signals(key, prefix):
            out = []
            for w, h in enumerate(self.hashes):
                s = Signal(A, name=f"{prefix}{w}")
                m.d.comb += s.eq(h.gateware(key))
                out.append(s)
            return out

        cur_key, cur_val, cur_vis = self._cur_key, self._cur_val, self._cur_vis
        old_key, old_val, old_vis = self._old_key, self._old_val, self._old_vis
        st_valid, st_key, st_val = self._st_valid, self._st_key, self._st_val
        hide, cmd_key = self._hide, self._cmd_key

        # -- lookup stage 0: hash, register ----------------------------------------------------
        lk_key = Signal(KEY_BITS)
        m.d.comb += lk_key.eq(self.lookup.payload.key)
        lk_addr = hash_signals(lk_key, "lk_h")
        s1_valid, s1_key, s1_mask = self._s1_valid, self._s1_key, self._s1_mask
        s1_tag = Signal(T)
        s1_addr = [Signal(A, name=f"s1_addr{w}") for w in range(W)]
        m.d.sync += [
            s1_valid.eq(self.lookup.valid),
            s1_key.eq(lk_key),
            s1_tag.eq(self.lookup.payload.tag),
        ]
        m.d.sync += [s1_addr[w].eq(lk_addr[w]) for w in range(W)]

        # -- lookup stage 1: memory read; registers and write collisions of this same cycle ------
        reg_pairs = []
        for i in range(S):
            h = Signal(name=f"s1_st_hit{i}")
            m.d.comb += h.eq(st_valid[i] & (st_key[i] == s1_key))
            reg_pairs.append((h, st_val[i]))
        for vis, key, val, name in ((cur_vis, cur_key, cur_val, "cur"), (old_vis, old_key, old_val, "old")):
            h = Signal(name=f"s1_{name}_hit")
            m.d.comb += h.eq(vis & (key == s1_key))
            reg_pairs.append((h, val))
        s2_valid, s2_hide = Signal(), Signal()
        s2_key, s2_tag, s2_mask = Signal(KEY_BITS), Signal(T), Signal(W)
        # Each register's hit and a copy of its value (the registers may change at this edge),
        # merged in stage 2: the OR of the values was the second half of a stage-1 path of 8 LUT
        # levels from ``s1_key`` (6 key compares, then the value OR) in the out-of-context rxflow
        # netlist at ec958a5; stage 2 has room for it now that it only registers the read data.
        s2_reg_hits = Signal(len(reg_pairs))
        s2_reg_vals = [Signal(V, name=f"s2_reg_val{i}") for i in range(len(reg_pairs))]
        for w in range(W):
            m.d.comb += [
                lk_rd[w].addr.eq(s1_addr[w]),
                s1_mask[w].eq(mg_wr[w].en & (mg_wr[w].addr == s1_addr[w])),
            ]
        m.d.sync += [
            s2_valid.eq(s1_valid),
            s2_key.eq(s1_key),
            s2_tag.eq(s1_tag),
            s2_reg_hits.eq(Cat(*[h for h, _ in reg_pairs])),
            s2_hide.eq(hide & (cmd_key == s1_key)),
            s2_mask.eq(s1_mask),
        ]
        m.d.sync += [r.eq(v) for r, (_, v) in zip(s2_reg_vals, reg_pairs, strict=True)]

        # -- lookup stage 2: register the ways' read data, and nothing else ----------------------
        # Cut: way read data (a DP16KD output, 1.42 ns clock-to-out, the ways' block RAMs spread
        # over the die) -> key compare -> hit -> value select -> result was the worst path of the
        # flow table, -3.23 ns routed on the ECPIX-5 core at ec958a5 (7 LUT levels). Now a block
        # RAM output goes straight to a register (yosys's bypass multiplexer of the transparent
        # lookup port, one LUT, at most). ``mask`` and ``hide`` are folded into one enable per
        # way, and the registers' hits and values are merged and cleared by ``hide`` here, off
        # the next stage.
        s3_valid, s3_reg_hit = Signal(), Signal()
        s3_key, s3_tag, s3_reg_val, s3_use = Signal(KEY_BITS), Signal(T), Signal(V), Signal(W)
        s3_data = [Signal(E, name=f"s3_data{w}") for w in range(W)]
        for w in range(W):
            d = Signal(E, name=f"s2_data{w}")
            m.d.comb += d.eq(self._lookup_read(m, w, lk_rd[w], mg_wr[w]))
            m.d.sync += s3_data[w].eq(d)
        m.d.sync += [
            s3_valid.eq(s2_valid),
            s3_key.eq(s2_key),
            s3_tag.eq(s2_tag),
            s3_use.eq(~s2_mask & Mux(s2_hide, 0, (1 << W) - 1)),
            s3_reg_hit.eq(s2_reg_hits.any() & ~s2_hide),
            s3_reg_val.eq(Mux(s2_hide, 0, _or_values(
                [(s2_reg_hits[i], s2_reg_vals[i]) for i in range(len(reg_pairs))], V))),
        ]

        # -- lookup stage 3: compare the ways, merge, register the result ------------------------
        way_pairs = []
        for w in range(W):
            d = s3_data[w]
            h = Signal(name=f"s3_hit{w}")
            m.d.comb += h.eq(d.valid & s3_use[w] & (d.key.as_value() == s3_key))
            way_pairs.append((h, d.value))
        r_valid, r_hit, r_val, r_tag = Signal(), Signal(), Signal(V), Signal(T)
        m.d.sync += [
            r_valid.eq(s3_valid),
            r_hit.eq(_any([h for h, _ in way_pairs]) | s3_reg_hit),
            # Every term is 0 unless its own hit is set (``hide`` cleared them a stage earlier),
            # so the value is a plain OR, with no mux on the OR of the hits.
            r_val.eq(_or_values(way_pairs, V) | s3_reg_val),
            r_tag.eq(s3_tag),
        ]
        m.d.comb += [
            self.result.valid.eq(r_valid),
            self.result.payload.hit.eq(r_hit),
            self.result.payload.value.eq(r_val),
            self.result.payload.tag.eq(r_tag),
        ]

        # -- manager --------------------------------------------------------------------------
        op = Signal(2)
        cmd_val = Signal(V)
        rehome = Signal()            # the walk re-homes stash entry ``rh_sel`` (after a delete)
        cur_addr = [Signal(A, name=f"cur_addr{w}") for w in range(W)]
        way = Signal(range(W))       # the way written by WRITE / restored by the undo
        frm = Signal(range(W))       # the way the carried key was evicted from
        kicks = Signal(range(K + 1))
        cnt = Signal(16)
        occupancy = Signal(V + 1)
        rh_sel = Signal(range(max(S, 1)))
        rh_tried = Signal(max(S, 1))

        # The victim generator: xorshift16 (7, 9, 8), full period, stepped every clock.
        lfsr = Signal(16, init=random.Random(f"flow-lfsr:{self.seed}").getrandbits(16) or 1)
        x1 = lfsr ^ (lfsr << 7)[:16]
        x2 = x1 ^ (x1 >> 9)
        m.d.sync += lfsr.eq(x2 ^ (x2 << 8)[:16])
        rnd = Signal(8)
        m.d.comb += rnd.eq(lfsr[8:])
        victim_any = Signal(range(W))          # uniform in 0..W-1
        victim_skip = Signal(range(W))         # uniform in 0..W-1 except frm
        r_skip = Signal(range(W))
        def scale(n):     # (rnd * n) >> 8 as shifts and adds (yosys would spend a DSP on it)
            return sum(rnd << b for b in range(n.bit_length()) if n >> b & 1) >> 8
        m.d.comb += [
            victim_any.eq(scale(W)),
            r_skip.eq(scale(W - 1)),
            victim_skip.eq(r_skip + (r_skip >= frm)),
        ]

        # Hash units of the manager: the command's key (IDLE), the evictee (WRITE, UNDO_WRITE)
        # (a stash entry to re-home brings its slot addresses, below). Two units, not one
        # behind a key multiplexer: that multiplexer's select is the FSM state, and in front of
        # the hash it made FSM state -> hash -> address the routed ECPIX-5 core's worst path
        # (14.7 ns, 2026-12-07). Now the state selects between the two hashes, at the end.
        cmd_key_in = Signal(KEY_BITS)
        m.d.comb += cmd_key_in.eq(self.cmd.payload.key)
        # The command's key as it was on the port one clock earlier, a plain register (its only
        # load is this register): IDLE reads the slots of that key, hashed from here, not from
        # the port. Hashed straight from the port, the key's net (from a register in the parent,
        # ~100 hash LUTs next to the four ways' block RAMs) was 6.3 ns routed on the ECPIX-5 core
        # at e7458bf, on the way to the ways' addresses (-3.95 ns), ``cur_addr`` (-2.03 ns) and
        # Yosys's collision compare of the transparent lookup ports (``s2_mask``, -4.13 ns).
        # ``pre_key_at`` keeps it for the transfer's PROBE, where ``stale`` tells whether it was
        # the transferred key (see CHECK).
        pre_key, pre_key_at, stale = Signal(KEY_BITS), Signal(KEY_BITS), Signal()
        m.d.sync += pre_key.eq(cmd_key_in)
        nh_cmd = hash_signals(pre_key, "mg_hc")
        nh = hash_signals(old_key, "mg_h")
        writing = Signal()
        rehash = Signal()            # REREAD: every way reads the slots of ``old``'s key
        idle = Signal()

        # Manager port addresses: every way reads/writes the carried key's slot, except that in
        # WRITE / UNDO_WRITE the ways other than the written one read the next carried key's, and
        # that IDLE reads the slots of the key offered on ``cmd`` (so the data is out of the RAM
        # in PROBE, where it is compared; see ``t_hit`` below).
        wr_en = Signal(W)
        wr_valid = Signal(init=1)
        for w in range(W):
            a = Signal(A, name=f"mg_addr{w}")
            m.d.comb += a.eq(Mux(idle, nh_cmd[w],
                                 Mux(rehash | (writing & (way != w)), nh[w], cur_addr[w])))
            m.d.comb += [
                mg_rd[w].addr.eq(a),
                mg_wr[w].addr.eq(a),
                mg_wr[w].en.eq(wr_en[w]),
                mg_wr[w].data.valid.eq(wr_valid),
                mg_wr[w].data.key.eq(cur_key),
                mg_wr[w].data.value.eq(cur_val),
            ]
        rd = [Signal(E, name=f"mg_data{w}") for w in range(W)]
        m.d.comb += [rd[w].eq(mg_rd[w].data) for w in range(W)]

        # The ways of each eviction, for the undo (the address is the hash of the key carried
        # back). LATCH presents kicks-1, UNDO_LATCH kicks-2: the read data is the next step's way.
        m.submodules.path = path = Memory(shape=range(W), depth=K, init=[])
        path_wr = path.write_port()
        path_rd = path.read_port(domain="sync")
        m.d.comb += [path_wr.addr.eq(kicks), path_wr.data.eq(way)]

        # Comparisons of the carried key with the manager's read data and the stash, made in
        # PROBE and registered for CHECK (their only user): the read data in PROBE comes from the
        # read IDLE made at the command key's slots, the same slots PROBE reads for CHECK (no
        # write in between), and ``cur_key`` and the stash do not change in PROBE. So the key
        # compare is not on the path from the RAM's read data to the manager's next address.
        t_hit = Signal(W)
        empty = Signal(W)
        for w in range(W):
            m.d.sync += t_hit[w].eq(rd[w].valid & (rd[w].key.as_value() == cur_key))
            m.d.comb += empty[w].eq(~rd[w].valid)
        s_hit = Signal(max(S, 1))
        for i in range(S):
            m.d.sync += s_hit[i].eq(st_valid[i] & (st_key[i] == cur_key))
        found_val = Signal(V)
        m.d.comb += found_val.eq(_or_values(
            [(t_hit[w], rd[w].value) for w in range(W)] + [(s_hit[i], st_val[i]) for i in range(S)], V))
        first_empty = Signal(range(W))
        first_empty_other = Signal(range(W))   # excluding frm
        empty_other = Signal(W)
        m.d.comb += empty_other.eq(empty & ~(1 << frm)[:W])
        for w in reversed(range(W)):
            with m.If(empty[w]):
                m.d.comb += first_empty.eq(w)
            with m.If(empty_other[w]):
                m.d.comb += first_empty_other.eq(w)
        st_free = Signal(range(max(S, 1)))
        st_room = Signal()
        st_any = Signal()
        rh_next = Signal(range(max(S, 1)))
        rh_more = Signal()
        m.d.comb += [st_room.eq(~st_valid[:S].all() if S else 0), st_any.eq(st_valid[:S].any() if S else 0)]
        rh_cand = Signal(max(S, 1))
        m.d.comb += rh_cand.eq(st_valid & ~rh_tried if S else 0)
        m.d.comb += rh_more.eq(rh_cand.any())
        for i in reversed(range(S)):
            with m.If(~st_valid[i]):
                m.d.comb += st_free.eq(i)
            with m.If(rh_cand[i]):
                m.d.comb += rh_next.eq(i)
        # The stash entry to re-home next: its key, value and slot addresses. Each stash entry
        # keeps the slot addresses of its key (``cur_addr`` when ``cur`` went to the stash: the
        # manager always loads ``cur_addr`` with the hash of ``cur_key``), so starting a re-home
        # walk is a selection of registers, with no hash unit on the way.
        st_addr = [Signal(W * A, name=f"st_addr{i}") for i in range(S)]
        rh_key, rh_val = Signal(KEY_BITS), Signal(V)
        rh_addr = [Signal(A, name=f"rh_addr{w}") for w in range(W)]
        if S:
            m.d.comb += [rh_key.eq(Cat(*st_key).word_select(rh_next, KEY_BITS)),
                         rh_val.eq(Cat(*st_val).word_select(rh_next, V)),
                         Cat(*rh_addr).eq(Cat(*st_addr).word_select(rh_next, W * A))]

        # Response.
        resp_fire = Signal()
        resp_status = Signal(2)
        resp_val = Signal(V)
        m.d.comb += [
            self.resp.valid.eq(resp_fire),
            self.resp.payload.status.eq(resp_status),
            self.resp.payload.value.eq(resp_val),
            self.resp.payload.cycles.eq(cnt),
            self.occupancy.eq(occupancy),
            self.stash_used.eq(sum(st_valid[i] for i in range(S)) if S else 0),
        ]
        with m.If(self.busy & (cnt != 0xFFFF)):
            m.d.sync += cnt.eq(cnt + 1)

        def respond(status, value=0):
            m.d.comb += [resp_fire.eq(1), resp_status.eq(status), resp_val.eq(value)]

        def load_cur(key, val, addr):
            m.d.sync += [cur_key.eq(key), cur_val.eq(val)]
            m.d.sync += [cur_addr[w].eq(addr[w]) for w in range(W)]

        def start_rehome(load=True):
            """Re-home the next untried stash entry, or answer the delete. ``load=False``: the
            caller loads ``cur`` with the entry itself (``load_rehome``)."""
            with m.If(rh_more):
                if load:
                    load_cur(rh_key, rh_val, rh_addr)
                m.d.sync += [rh_sel.eq(rh_next), rh_tried.eq(rh_tried | (1 << rh_next)[:S]),
                             rehome.eq(1), cur_vis.eq(0)]
                m.next = "PROBE"
            with m.Else():
                respond(FlowStatus.OK)
                m.d.sync += cur_vis.eq(0)
                m.next = "IDLE"

        def placed():
            """``cur`` was written into an empty slot this cycle: the walk is over."""
            m.d.sync += [cur_vis.eq(0), hide.eq(0)]
            if S:
                with m.If(rehome):
                    m.d.sync += st_valid.bit_select(rh_sel, 1).eq(0)
            with m.If(~rehome):
                m.d.sync += occupancy.eq(occupancy + 1)
            respond(FlowStatus.OK)
            m.next = "IDLE"

        def load_old(victim):
            """Copy the occupant of ``victim`` into ``old``'s key and value, in every cycle of
            CHECK and LATCH whatever they decide: ``old`` is only compared while ``old_vis``
            (set by ``evict`` alone) and only hashed in WRITE, after an eviction, so a copy
            that is not an eviction is never seen. Its ~45 flip-flops' enables were on the path
            read data (``valid``) -> empty -> decision, part of the 212 endpoints failing from
            ``mg_data3`` routed on the ECPIX-5 core at ec958a5."""
            m.d.sync += [
                old_key.eq(Cat(*[rd[w].key.as_value() for w in range(W)]).word_select(victim, KEY_BITS)),
                old_val.eq(Cat(*[rd[w].value for w in range(W)]).word_select(victim, V)),
            ]

        def evict(victim):
            """The occupant of ``victim`` (all ways full; copied into ``old`` by ``load_old``)
            is evicted; WRITE is next."""
            m.d.sync += [
                way.eq(victim),
                old_vis.eq(1),
                cur_vis.eq(1),
            ]
            m.next = "WRITE"

        m.d.comb += self.busy.eq(1)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.busy.eq(0), self.cmd.ready.eq(1), idle.eq(1)]
                with m.If(self.cmd.valid):
                    load_cur(cmd_key_in, self.cmd.payload.value, nh_cmd)
                    m.d.sync += [
                        pre_key_at.eq(pre_key),
                        op.eq(self.cmd.payload.op),
                        cmd_key.eq(cmd_key_in),
                        cmd_val.eq(self.cmd.payload.value),
                        cur_vis.eq(0),
                        old_vis.eq(0),
                        rehome.eq(0),
                        rh_tried.eq(0),
                        cnt.eq(1),
                    ]
                    m.next = "PROBE"

            with m.State("PROBE"):          # every way reads the key's slot
                # IDLE read the slots of ``pre_key_at``: the command's key only if the source
                # put it on the port a clock before the transfer (the compared data, ``t_hit``,
                # is of that read). Otherwise CHECK re-reads.
                m.d.sync += stale.eq(pre_key_at != cmd_key)
                m.next = "CHECK"

            with m.State("REREAD"):         # every way reads the slots of old's key (= cmd_key)
                m.d.comb += rehash.eq(1)
                m.d.sync += [cur_addr[w].eq(nh[w]) for w in range(W)]
                m.d.sync += pre_key_at.eq(cmd_key)
                m.next = "PROBE"

            with m.State("CHECK"):
                load_old(victim_any)
                with m.If(stale & ~rehome):
                    # IDLE read the slots of another key (``t_hit`` is of that read, and
                    # ``cur_addr`` its hash): read the command key's slots (REREAD, hashed by
                    # the evictee's unit from ``old``: ``old_vis`` is 0, lookups ignore it), then
                    # PROBE and CHECK again. Nothing was written or answered: 2 cycles more.
                    m.d.sync += old_key.eq(cmd_key)
                    m.next = "REREAD"
                with m.Elif(rehome):
                    with m.If(empty.any()):
                        m.d.comb += wr_en.eq(1 << first_empty)
                        placed()
                    with m.Else():
                        evict(victim_any)
                        m.d.sync += kicks.eq(0)
                with m.Elif((op == FlowOp.LOOKUP) | (op == FlowOp.NOP)):
                    with m.If((op == FlowOp.NOP) | t_hit.any() | s_hit.any()):
                        respond(FlowStatus.OK, found_val)
                    with m.Else():
                        respond(FlowStatus.NOT_FOUND)
                    m.next = "IDLE"
                with m.Elif(op == FlowOp.DELETE):
                    with m.If(t_hit.any()):
                        m.d.comb += [wr_en.eq(t_hit), wr_valid.eq(0)]
                        m.d.sync += occupancy.eq(occupancy - 1)
                        start_rehome()
                    with m.Elif(s_hit.any()):
                        m.d.sync += [st_valid.eq(st_valid & ~s_hit), occupancy.eq(occupancy - 1)]
                        respond(FlowStatus.OK)
                        m.next = "IDLE"
                    with m.Else():
                        respond(FlowStatus.NOT_FOUND)
                        m.next = "IDLE"
                with m.Else():                                    # INSERT
                    with m.If(t_hit.any() | s_hit.any()):
                        respond(FlowStatus.EXISTS, found_val)
                        m.next = "IDLE"
                    with m.Elif(empty.any()):
                        m.d.comb += wr_en.eq(1 << first_empty)
                        placed()
                    with m.Else():
                        evict(victim_any)
                        m.d.sync += [kicks.eq(0), hide.eq(1)]

            with m.State("WRITE"):
                # cur over the slot whose occupant is in old; the other ways read old's slots.
                m.d.comb += [writing.eq(1), wr_en.eq(1 << way), path_wr.en.eq(1)]
                load_cur(old_key, old_val, nh)
                m.d.sync += [frm.eq(way), kicks.eq(kicks + 1), old_vis.eq(0)]
                m.next = "LATCH"

            with m.State("LATCH"):
                m.d.comb += path_rd.addr.eq(kicks - 1)
                if S:
                    # The next stash entry to re-home is loaded into ``cur`` whether or not
                    # this step finds an empty slot: if it does, the write below takes ``cur``
                    # as it was before this edge, and ``cur`` goes invisible (``placed``). So
                    # the enable of ``cur``'s ~80 flip-flops does not wait for the read data (a
                    # block RAM across the die: 13.3 ns routed on the ECPIX-5 core, 2026-12-07).
                    with m.If((kicks == K) & rehome & rh_more):
                        load_cur(rh_key, rh_val, rh_addr)
                    # Likewise the stash entry that takes the homeless key is written whether or
                    # not this step finds an empty slot; only its ``valid`` bit waits for the
                    # read data. If the step finds one, the entry stays invalid (a free entry,
                    # ``st_free``) or is invalidated at this edge (``rh_sel``, by ``placed``), and
                    # an invalid entry's contents are never used. The enables of the stash's
                    # ~340 key, address and value flip-flops were on read data (``valid``) ->
                    # empty -> decision: 160 of the 212 endpoints failing from ``mg_data3``
                    # routed on the ECPIX-5 core at ec958a5 (-2.45 ns).
                    with m.If(kicks == K):
                        with m.If(rehome):
                            # The homeless key takes the place of the entry being re-homed
                            # (that entry is in the table now), so no undo is needed.
                            m.d.sync += [
                                Cat(*st_key).word_select(rh_sel, KEY_BITS).eq(cur_key),
                                Cat(*st_addr).word_select(rh_sel, W * A).eq(Cat(*cur_addr)),
                                Cat(*st_val).word_select(rh_sel, V).eq(cur_val),
                            ]
                        with m.Elif(st_room):
                            m.d.sync += [
                                Cat(*st_key).word_select(st_free, KEY_BITS).eq(cur_key),
                                Cat(*st_addr).word_select(st_free, W * A).eq(Cat(*cur_addr)),
                                Cat(*st_val).word_select(st_free, V).eq(cur_val),
                            ]
                load_old(victim_skip)
                with m.If(empty_other.any()):
                    m.d.comb += wr_en.eq(1 << first_empty_other)
                    placed()
                with m.Elif(kicks == K):
                    if S:
                        with m.If(rehome):
                            start_rehome(load=False)     # entry rh_sel holds cur now (above)
                        with m.Elif(st_room):
                            m.d.sync += [
                                st_valid.bit_select(st_free, 1).eq(1),   # entry written above
                                cur_vis.eq(0),
                                hide.eq(0),
                                occupancy.eq(occupancy + 1),
                            ]
                            respond(FlowStatus.OK)
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "UNDO_READ"
                    else:
                        m.next = "UNDO_READ"
                with m.Else():
                    evict(victim_skip)

            with m.State("UNDO_READ"):      # every way reads cur's slot; path data = last way
                m.d.sync += way.eq(path_rd.data)
                m.next = "UNDO_LATCH"

            with m.State("UNDO_LATCH"):
                m.d.comb += path_rd.addr.eq(kicks - 2)
                m.d.sync += [
                    old_key.eq(Cat(*[rd[w].key.as_value() for w in range(W)]).word_select(way, KEY_BITS)),
                    old_val.eq(Cat(*[rd[w].value for w in range(W)]).word_select(way, V)),
                    old_vis.eq(1),
                    kicks.eq(kicks - 1),
                ]
                m.next = "UNDO_WRITE"

            with m.State("UNDO_WRITE"):
                # cur back over the slot it came from (its occupant in old); the previous step's
                # way (path data) reads old's slot there.
                m.d.comb += [writing.eq(1), wr_en.eq(1 << way)]
                load_cur(old_key, old_val, nh)
                m.d.sync += old_vis.eq(0)
                with m.If(kicks == 0):     # cur becomes the inserted key again: drop it
                    m.d.sync += [cur_vis.eq(0), hide.eq(0)]
                    respond(FlowStatus.FULL)
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += way.eq(path_rd.data)
                    m.next = "UNDO_LATCH"

        return m
