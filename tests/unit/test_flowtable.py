"""stellar.hdl.flow.cuckoo: the flow table in the Amaranth simulator against a Python dict.

The reference is a dict key -> value updated at each command response: INSERT of a present key
answers EXISTS with the stored value; of an absent key OK (stored) or FULL (nothing changes);
DELETE OK (removed) or NOT_FOUND; LOOKUP OK + value or NOT_FOUND. Every cycle a lookup (random
valid, random tag) enters the lookup port; its result, exactly ``LATENCY`` cycles later, must
equal the dict as it stood when the lookup was presented -- except for the key of the command
in progress, which may read the state before or after that command (lookups presented after
the response cycle see the new state).

The design under test reads block RAM during a write of the same slot on another port, which is
undefined on an FPGA (the simulator returns the old data). ``JunkOnCollision`` replaces such a
read with junk: either an empty slot or the looked-up key itself with a random value. A design
that used the collided read would miss a moving key or hit with a wrong value.
"""

from collections import deque

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Cat, Mux, Signal, Value
from amaranth.sim import Simulator
from stellar.hdl.flow.cuckoo import FlowTable
from stellar.hdl.flow.fields import FlowOp, FlowStatus, flow_key
from stellar.sim.amaranth_streams import run_seeds, seeded_rng

INSERT, DELETE, LOOKUP, NOP = FlowOp.INSERT, FlowOp.DELETE, FlowOp.LOOKUP, FlowOp.NOP
OK, EXISTS, FULL, NOT_FOUND = FlowStatus.OK, FlowStatus.EXISTS, FlowStatus.FULL, FlowStatus.NOT_FOUND


class JunkOnCollision(FlowTable):
    """A FlowTable whose lookup read of a slot the manager writes in the same cycle returns
    junk (driven by the test bench): ``junk_valid`` and ``junk_value``, with the looked-up key."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.junk_valid = Signal()
        self.junk_value = Signal(self.value_bits)
        self.collisions = Signal(32)

    def _lookup_read(self, m, way, port, write_port):
        hit = Signal(name=f"tb_collide{way}")
        key = Signal(32, name=f"tb_key{way}")
        m.d.sync += [hit.eq(port.en & write_port.en & (port.addr == write_port.addr)), key.eq(self._s1_key)]
        if way == 0:
            m.d.sync += self.collisions.eq(self.collisions + self._s1_mask.any())
        junk = Signal(self.entry_layout, name=f"tb_junk{way}")
        m.d.comb += [junk.valid.eq(self.junk_valid), junk.key.eq(key), junk.value.eq(self.junk_value)]
        return Mux(hit, junk.as_value(), port.data.as_value())


class Command:
    def __init__(self, op, key, value):
        self.op, self.key, self.value = op, key, value
        self.transfer = self.resp = None
        self.old = self.new = None       # the key's (value or None) before / after
        self.pending = []                # ambiguous lookup results waiting for the response
        self.status = None
        self.cov = 0                     # lookups of a key in the cycle it moved, during this command
        self.load = None                 # table load before an insert (fill plans)
        self.early = None                # its key was on the port the clock before the transfer


class Bench:
    """Drives ``cmd`` from a plan (a generator: yields a command ``(op, key, value)`` and is sent
    its status, or a list of commands issued back to back and is sent their statuses, or
    ``("sweep", keys)`` to present those keys on the lookup port on consecutive cycles), presents
    a lookup in most cycles and checks everything against the dict model. A command is put on
    the port (``valid`` low) a clock before it is offered with probability ``p_early`` (as a
    source that registers its payload first); otherwise payload and ``valid`` come together."""

    def __init__(self, dut, rng, *, p_cmd=0.8, p_lookup=0.92, inflight_bias=0.25, new_keys=None,
                 p_early=0.7):
        self.dut, self.rng = dut, rng
        self.p_early = p_early
        self.new_keys = new_keys         # an iterator of keys to insert (default: random keys)
        self.p_cmd, self.p_lookup, self.inflight_bias = p_cmd, p_lookup, inflight_bias
        self.model = {}
        self.keylist, self.keypos = [], {}
        self.recent = deque(maxlen=16)
        self.inflight = ()
        self.log = []                    # finished commands
        self.lookups = 0
        self.hits = 0
        self.ambiguous = 0
        self.cov_cur = self.cov_old = 0  # lookups of a key in the cycle it is written / overwritten
        self.full_loads = []
        self.max_stash = 0
        self.cycles = 0
        self.ctx = None
        self.sweep = deque()
        self.occupancy = self.stash_used = 0     # as sampled at the last edge
        self.V = dut.value_bits
        self.T = dut.tag_bits
        cl = dut.cmd.payload.shape()
        self.cmd_key_at, self.cmd_val_at = cl["key"].offset, cl["value"].offset
        ll = dut.lookup.payload.shape()
        self.lk_tag_at = ll["tag"].offset

    # -- model ----------------------------------------------------------------------------------
    def _store(self, key, value):
        if key not in self.model:
            self.keypos[key] = len(self.keylist)
            self.keylist.append(key)
        self.model[key] = value

    def _remove(self, key):
        del self.model[key]
        i = self.keypos.pop(key)
        last = self.keylist.pop()
        if i < len(self.keylist):
            self.keylist[i] = last
            self.keypos[last] = i

    def new_key(self):
        while True:
            k = next(self.new_keys) if self.new_keys is not None else self.rng.getrandbits(32)
            if k not in self.model:
                return k

    def present_key(self):
        return self.rng.choice(self.keylist) if self.keylist else self.new_key()

    def lookup_key(self, active):
        r = self.rng.random()
        if r < self.inflight_bias and self.inflight:
            return self.rng.choice(self.inflight)
        r = self.rng.random()
        if r < 0.5:
            return self.present_key()
        if r < 0.65 and active is not None:
            return active.key
        if r < 0.8 and self.recent:
            return self.rng.choice(self.recent)
        if r < 0.9 and self.keylist:
            return self.present_key() ^ (1 << self.rng.randrange(32))    # a near miss
        return self.rng.getrandbits(32)

    # -- checks ---------------------------------------------------------------------------------
    def check_result(self, entry, hit, value, tag):
        t, key, want_tag, old, cmd = entry
        assert tag == want_tag, f"lookup at {t}: tag {tag} != {want_tag}"
        got = value if hit else None
        if not hit:
            assert value == 0, f"lookup at {t}: miss with value {value}"
        if cmd is None:
            assert got == old, f"lookup at {t} of {key:#010x}: got {got}, model {old}"
        elif cmd.resp is None:
            cmd.pending.append((t, key, got))
        else:
            self.check_ambiguous(cmd, t, key, got)

    def check_ambiguous(self, cmd, t, key, got):
        self.ambiguous += 1
        assert got in (cmd.old, cmd.new), (
            f"lookup at {t} of {key:#010x} during command {cmd.op.name} (cycles {cmd.transfer}.."
            f"{cmd.resp}): got {got}, before {cmd.old}, after {cmd.new}")

    def check_resp(self, cmd, status, value, cycles):
        name = f"{cmd.op.name} {cmd.key:#010x} at {cmd.transfer}"
        status = FlowStatus(status)
        old = self.model.get(cmd.key)
        cmd.old = old
        assert cycles == min(cmd.resp - cmd.transfer, 0xFFFF), f"{name}: cycles {cycles}"
        if cmd.op == INSERT:
            if old is not None:
                assert (status, value) == (EXISTS, old), f"{name}: {status.name} {value}, stored {old}"
            else:
                assert status in (OK, FULL), f"{name}: {status.name}"
                if status == OK:
                    self._store(cmd.key, cmd.value)
                else:
                    self.full_loads.append(len(self.model))
        elif cmd.op == DELETE:
            assert status == (OK if old is not None else NOT_FOUND), f"{name}: {status.name}"
            if old is not None:
                self._remove(cmd.key)
        elif cmd.op == LOOKUP:
            if old is None:
                assert status == NOT_FOUND, f"{name}: {status.name}"
            else:
                assert (status, value) == (OK, old), f"{name}: {status.name} {value}, stored {old}"
        else:
            assert status == OK, f"{name}: {status.name}"
        cmd.new = self.model.get(cmd.key)
        cmd.status = status
        self.recent.append(cmd.key)
        for t, key, got in cmd.pending:
            self.check_ambiguous(cmd, t, key, got)
        self.log.append(cmd)

    # -- the clock loop -------------------------------------------------------------------------
    async def run(self, ctx, plan, *, max_cycles=200_000, tail=8):
        self.ctx = ctx
        dut = self.dut
        junk = isinstance(dut, JunkOnCollision)
        drives = [dut.cmd.valid, dut.cmd.payload.as_value(), dut.lookup.valid, dut.lookup.payload.as_value()]
        if junk:
            drives += [dut.junk_valid, dut.junk_value]
        bus = Cat(*drives)
        cmd_w, lk_w = len(dut.cmd.payload.as_value()), len(dut.lookup.payload.as_value())
        samples = [dut.cmd.ready, dut.busy, dut.resp.valid, dut.resp.payload.status, dut.resp.payload.value,
                   dut.resp.payload.cycles, dut.result.valid, dut.result.payload.hit,
                   dut.result.payload.value, dut.result.payload.tag, dut.occupancy, dut.stash_used,
                   dut._cur_vis, dut._cur_key, dut._old_vis, dut._old_key,
                   dut._s1_valid, dut._s1_key, dut._s1_mask]
        rng = self.rng
        queue = deque()                  # commands known, not yet offered
        batch_status = None              # statuses collected for the batch in flight
        batch_left = 0
        offered = None                   # command held on cmd until it transfers
        staged = None                    # command on the port with valid low, offered next
        last_key = None                  # the key bits on the port the clock before
        active = None                    # transferred, no response yet
        pipe = deque()                   # lookups in flight: (t, key, tag, old, cmd) or None
        plan_done = False
        status_to_send = None
        first = True
        cmd_junk = rng.getrandbits(cmd_w)
        end = None
        t = 0
        while True:
            # Ask the plan for more when everything it asked for has been answered.
            if (not plan_done and not queue and offered is None and active is None and batch_left == 0
                    and not self.sweep):
                try:
                    item = plan.send(None) if first else plan.send(status_to_send)
                    first = False
                except StopIteration:
                    plan_done = True
                    end = t + tail
                else:
                    if isinstance(item, tuple) and item[0] == "sweep":
                        self.sweep.extend(item[1])
                        status_to_send = None
                    elif isinstance(item, list):
                        queue.extend(Command(*c) for c in item)
                        batch_status, batch_left = [], len(item)
                    else:
                        queue.append(Command(*item))
                        batch_status, batch_left = None, 1
            if end is not None and t >= end:
                break
            assert t < max_cycles, "the plan did not finish"
            # Drive.
            if staged is not None:
                offered, staged = staged, None       # its payload is on the port already
            elif offered is None and queue and (self.p_cmd >= 1 or rng.random() < self.p_cmd):
                c = queue.popleft()
                cmd_bits = int(c.op) | c.key << self.cmd_key_at | c.value << self.cmd_val_at
                if rng.random() < self.p_early:
                    staged = c
                else:
                    offered = c
            elif offered is None:
                cmd_bits = cmd_junk
            driven_key = (cmd_bits >> self.cmd_key_at) & 0xFFFF_FFFF
            if self.sweep:
                lk_valid, lk_key = 1, self.sweep.popleft()
            else:
                lk_valid = int(rng.random() < self.p_lookup)
                lk_key = self.lookup_key(active)
            lk_tag = rng.getrandbits(self.T) if self.T else 0
            value = (int(offered is not None) | cmd_bits << 1
                     | lk_valid << (1 + cmd_w) | (lk_key | lk_tag << self.lk_tag_at) << (2 + cmd_w))
            if junk:
                value |= (rng.getrandbits(1) | rng.getrandbits(self.V) << 1) << (2 + cmd_w + lk_w)
            ctx.set(bus, value)
            (_clk, _rst, ready, busy, r_valid, r_status, r_value, r_cycles, l_valid, l_hit, l_value, l_tag,
             occupancy, stash_used, cur_vis, cur_key, old_vis, old_key,
             s1_valid, s1_key, s1_mask) = await ctx.tick().sample(*samples)
            # Command handshake.
            assert ready == (not busy), f"edge {t}: cmd.ready {ready} busy {busy}"
            if active is None and offered is None:
                assert occupancy == len(self.model), f"edge {t}: occupancy {occupancy} != {len(self.model)}"
            assert stash_used <= dut.stash
            self.occupancy, self.stash_used = occupancy, stash_used
            self.max_stash = max(self.max_stash, stash_used)
            if offered is not None and ready:
                assert active is None
                active, offered = offered, None
                active.transfer = t
                active.early = last_key == active.key
                cmd_junk = rng.getrandbits(cmd_w)
            last_key = driven_key
            # The lookup presented in this cycle, against the model as it stands now.
            if lk_valid:
                amb = active if active is not None and active.key == lk_key else None
                pipe.append((t, lk_key, lk_tag, self.model.get(lk_key), amb))
                self.lookups += 1
            else:
                pipe.append(None)
            # Response.
            if r_valid:
                assert active is not None, f"edge {t}: resp without a command"
                active.resp = t
                self.check_resp(active, r_status, r_value, r_cycles)
                if batch_status is not None:
                    batch_status.append(active.status)
                batch_left -= 1
                if batch_left == 0:
                    status_to_send = batch_status if batch_status is not None else active.status
                active = None
            # Result of the lookup presented LATENCY cycles ago.
            if len(pipe) > dut.LATENCY:
                entry = pipe.popleft()
                assert l_valid == (entry is not None), f"edge {t}: result.valid {l_valid}"
                if entry is not None:
                    self.hits += l_hit
                    self.check_result(entry, l_hit, l_value, l_tag)
            else:
                assert not l_valid, f"edge {t}: result before any lookup"
            # Watch the moves: lookups in the very cycle their key is written or overwritten.
            if s1_valid and s1_mask:
                c, o = bool(cur_vis and s1_key == cur_key), bool(old_vis and s1_key == old_key)
                self.cov_cur += c
                self.cov_old += o
                if active is not None:
                    active.cov += c + o
            moving = tuple(k for v, k in ((cur_vis, cur_key), (old_vis, old_key)) if v)
            self.inflight = moving or self.inflight
            if cur_vis:
                self.recent.append(cur_key)
            t += 1
        self.cycles = t
        self.collisions = ctx.get(dut.collisions) if junk else None
        assert active is None and offered is None


def simulate(dut, bench, plan, **kw):
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def testbench(ctx):
        await bench.run(ctx, plan, **kw)

    sim.add_testbench(testbench)
    sim.run()
    return bench


def insert_stats(bench, capacity):
    """Average resp.cycles of the inserts that stored a key, by load before the insert."""
    out = {}
    for lo, hi in ((0.4, 0.6), (0.85, 0.95)):
        c = [cmd.resp - cmd.transfer for cmd in bench.log
             if cmd.op == INSERT and cmd.status == OK and lo <= (cmd.load or 0) < hi]
        out[(lo, hi)] = (sum(c) / len(c), len(c)) if c else (None, 0)
    return out


# -- plans ----------------------------------------------------------------------------------------

def fill_plan(bench, cap, *, fulls=2, side_ops=0.1):
    """Insert new keys until ``fulls`` FULL answers, with a few other commands on the way."""
    rng = bench.rng
    n_full = 0
    while n_full < fulls:
        r = rng.random()
        if r < side_ops:
            choice = rng.randrange(5)
            if choice == 0 and bench.keylist:
                k = bench.present_key()
                yield (INSERT, k, rng.getrandbits(bench.V))                 # EXISTS
            elif choice == 1 and bench.keylist:
                yield (LOOKUP, bench.present_key(), rng.getrandbits(bench.V))
            elif choice == 2:
                yield (LOOKUP, bench.new_key(), 0)
            elif choice == 3:
                yield (DELETE, bench.new_key(), 0)                           # NOT_FOUND
            else:
                yield (NOP, rng.getrandbits(32), 0)
            continue
        load = len(bench.model) / cap
        status = yield (INSERT, bench.new_key(), rng.getrandbits(bench.V))
        bench.log[-1].load = load
        if status == FULL:
            n_full += 1


def delete_plan(bench, fraction):
    for k in bench.rng.sample(bench.keylist, int(len(bench.keylist) * fraction)):
        yield (DELETE, k, 0)


def churn_plan(bench, n):
    """Random batches of commands (offered back to back while the table is busy)."""
    rng = bench.rng
    for _ in range(n):
        batch, keys = [], set()
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.35 and bench.keylist:
                k = bench.present_key()
                op = DELETE
            elif r < 0.8:
                k, op = bench.new_key(), INSERT
            elif r < 0.9 and bench.keylist:
                k, op = bench.present_key(), rng.choice([INSERT, LOOKUP])
            else:
                k, op = rng.getrandbits(32), rng.choice([DELETE, LOOKUP])
            if k in keys:
                continue
            keys.add(k)
            batch.append((op, k, rng.getrandbits(bench.V)))
        if batch:
            yield batch


def full_cycle_plan(bench, cap, n_churn):
    yield from fill_plan(bench, cap)
    yield from delete_plan(bench, 0.4)
    yield from fill_plan(bench, cap, fulls=1)
    yield from churn_plan(bench, n_churn)


# -- tests --------------------------------------------------------------------------------------

CONFIGS = [  # capacity, ways, stash, max_kicks
    (16, 2, 0, 16),
    (16, 4, 2, 8),
    (64, 2, 4, 32),
    (64, 4, 0, 32),
    (64, 4, 4, 64),
]


@pytest.mark.parametrize("seed", run_seeds([1, 2]))
@pytest.mark.parametrize("cap,ways,stash,kicks", CONFIGS)
def test_random_commands_against_model(cap, ways, stash, kicks, seed):
    """Fill to FULL, delete 40%, refill to FULL, then churn (batches offered while busy), with a
    lookup in ~92% of the cycles (present keys, the command's key, recently moved and deleted
    keys, near misses) and junk on every read-during-write collision: every response and every
    lookup result agrees with the dict model; FULL leaves every stored key in place."""
    rng = seeded_rng(f"flowtable-{cap}-{ways}-{stash}-{kicks}", seed)
    dut = JunkOnCollision(cap, ways=ways, stash=stash, tag_bits=3, max_kicks=kicks, seed=seed)
    bench = Bench(dut, rng)
    simulate(dut, bench, full_cycle_plan(bench, cap, 30))
    loads = [n / cap for n in bench.full_loads]
    print(f"{bench.cycles} cycles, {bench.lookups} lookups ({bench.hits} hits, {bench.ambiguous} "
          f"ambiguous), FULL at loads {loads}, stash max {bench.max_stash}, "
          f"moves looked up {bench.cov_cur}/{bench.cov_old}, collisions {bench.collisions}")
    assert len(bench.full_loads) >= 3
    floor = {2: 0.3, 4: 0.6}[ways]
    assert min(loads) >= floor
    assert bench.hits > bench.lookups // 4
    if stash:
        assert bench.max_stash > 0


def sweep_all(bench):
    """Present every stored key on the lookup port, back to back."""
    yield ("sweep", list(bench.keylist))


def full_sweep_plan(bench, cap, rounds):
    """Fill to FULL; then, ``rounds`` times: sweep every stored key, try more inserts (each FULL
    is followed by a sweep), delete a few keys."""
    for _ in range(rounds):
        yield from fill_plan(bench, cap, fulls=1, side_ops=0)
        before = dict(bench.model)
        for _ in range(3):
            status = yield (INSERT, bench.new_key(), bench.rng.getrandbits(bench.V))
            if status == FULL:
                assert bench.model == before
                yield from sweep_all(bench)
            before = dict(bench.model)
        yield from delete_plan(bench, 0.1)


@pytest.mark.parametrize("cap,ways,stash,kicks", [(16, 2, 0, 8), (64, 4, 2, 64)])
def test_full_leaves_table_unchanged(cap, ways, stash, kicks):
    """After every FULL answer the occupancy is unchanged and a back-to-back sweep of the lookup
    port finds every stored key with its value (the walk was undone in reverse)."""
    rng = seeded_rng(f"flowtable-full-{cap}-{ways}", 5)
    dut = JunkOnCollision(cap, ways=ways, stash=stash, max_kicks=kicks, seed=7)
    bench = Bench(dut, rng)
    simulate(dut, bench, full_sweep_plan(bench, cap, 3))
    fulls = [c for c in bench.log if c.status == FULL]
    print(f"{bench.cycles} cycles, {len(fulls)} FULL, loads {bench.full_loads}")
    assert len(fulls) >= 4
    # A FULL answer comes after the whole walk was undone: 2 cycles per eviction each way.
    assert all(c.resp - c.transfer >= 4 * kicks for c in fulls)


def stash_plan(bench, dut, cap):
    """Fill (the stash fills up too), then delete every key that is not in the stash: the stash
    entries are re-homed into the table as room appears."""
    yield from fill_plan(bench, cap, fulls=2, side_ops=0)
    yield (NOP, 0, 0)                                   # (the outputs as they are after a response)
    assert bench.stash_used == dut.stash, "the stash did not fill"
    stashed = {bench.ctx.get(k) for k in dut._st_key}
    assert stashed <= set(bench.model)
    for k in stashed:                                   # the stash answers commands too
        status = yield (INSERT, k, 0)
        assert status == EXISTS
        status = yield (LOOKUP, k, 0)
        assert status == OK
    yield from sweep_all(bench)
    victim = next(iter(stashed))                        # delete from the stash
    yield (DELETE, victim, 0)
    yield (NOP, 0, 0)
    assert bench.stash_used == dut.stash - 1
    stashed.discard(victim)
    status = yield (INSERT, victim, 1)                  # a stash entry is free again: stored
    assert status == OK
    for k in [k for k in bench.keylist if k not in stashed and k != victim]:
        yield (DELETE, k, 0)
    yield (NOP, 0, 0)
    assert bench.stash_used == 0, "stash entries were not re-homed"
    assert bench.occupancy == len(stashed) + 1
    yield from sweep_all(bench)


@pytest.mark.parametrize("ways", [2, 4])
def test_stash(ways):
    """A short walk limit sends keys to the stash: stash_used counts them, lookups and commands
    find them, EXISTS and DELETE work on them, FULL comes only once the stash is full, and
    deleting table keys re-homes the stash entries into the table."""
    rng = seeded_rng(f"flowtable-stash-{ways}", 11)
    cap = 16
    dut = JunkOnCollision(cap, ways=ways, stash=4, max_kicks=2, seed=3)
    bench = Bench(dut, rng)
    simulate(dut, bench, stash_plan(bench, dut, cap))
    first_full = next(c for c in bench.log if c.status == FULL)
    stash_fills = [c for c in bench.log if c.op == INSERT and c.status == OK and c.resp - c.transfer >= 6]
    print(f"{bench.cycles} cycles, FULL at {bench.full_loads}, {len(stash_fills)} walks")
    assert first_full.load * cap >= 4, "FULL before the stash was used"


def status_plan(bench):
    k1, k2, k3 = flow_key(3, 0x123456), flow_key(3, 0x123457), flow_key(200, 0x123456)
    assert (yield (LOOKUP, k1, 0)) == NOT_FOUND
    assert (yield (DELETE, k1, 0)) == NOT_FOUND
    assert (yield (INSERT, k1, 5)) == OK
    assert (yield (INSERT, k1, 9)) == EXISTS          # the stored 5 is reported (checked)
    assert (yield (LOOKUP, k1, 0)) == OK
    assert (yield (LOOKUP, k2, 0)) == NOT_FOUND       # QPN differs by one bit
    assert (yield (LOOKUP, k3, 0)) == NOT_FOUND       # other tenant, same QPN
    assert (yield (INSERT, k3, 6)) == OK
    assert (yield (NOP, k2, 0)) == OK
    assert (yield (DELETE, k1, 0)) == OK
    assert (yield (DELETE, k1, 0)) == NOT_FOUND
    assert (yield (LOOKUP, k3, 0)) == OK
    # Back to back (offered while busy).
    statuses = yield [(INSERT, k2, 7), (INSERT, k2, 8), (LOOKUP, k2, 0), (DELETE, k2, 0), (DELETE, k2, 0)]
    assert statuses == [OK, EXISTS, OK, OK, NOT_FOUND]
    yield from sweep_all(bench)


@pytest.mark.parametrize("tag_bits", [0, 8])
def test_statuses_latency_tag(tag_bits):
    """EXISTS (with the stored value), NOT_FOUND, NOP; tenant and QPN both part of the key;
    commands offered while busy wait for ``cmd.ready``; every lookup's result comes exactly
    ``LATENCY`` = 4 cycles later with its tag (also with a 0-bit tag); ``resp.cycles`` is the
    distance from transfer to response and a command that touches no walk takes 2 cycles, or 5
    when its key was not on the port the clock before its transfer (CHECK, REREAD, PROBE again)."""
    assert FlowTable.LATENCY == 4
    rng = seeded_rng(f"flowtable-status-{tag_bits}", 1)
    dut = FlowTable(64, ways=4, stash=2, tag_bits=tag_bits)
    assert dut.value_bits == 6 and len(dut.occupancy) == 7
    bench = Bench(dut, rng, p_cmd=0.6, p_lookup=0.7)
    simulate(dut, bench, status_plan(bench))
    assert all(c.resp - c.transfer == (2 if c.early else 5) for c in bench.log)
    assert any(c.early for c in bench.log) and not all(c.early for c in bench.log)
    assert bench.lookups > 30


def forwarding_plan(bench, cap, n):
    """Fill to FULL, then keep the table full: each round deletes one key and inserts two."""
    yield from fill_plan(bench, cap, fulls=1, side_ops=0)
    rng = bench.rng
    for _ in range(n):
        if bench.keylist:
            yield (DELETE, bench.present_key(), 0)
        for _ in range(2):
            yield (INSERT, bench.new_key(), rng.getrandbits(bench.V))


@pytest.mark.parametrize("cap,ways,stash,kicks", [(16, 4, 0, 16), (16, 2, 2, 8), (64, 4, 2, 32)])
def test_forwarding(cap, ways, stash, kicks):
    """Lookups aimed at the keys being moved (the in-flight registers, the keys just moved, the
    command's key) while the table is kept full: many lookups read a slot in the very cycle it
    is written with the moving key or overwritten while its occupant moves (the read result is
    junk then), also during undone walks; all agree with the model."""
    rng = seeded_rng(f"flowtable-forward-{cap}-{ways}", 2)
    dut = JunkOnCollision(cap, ways=ways, stash=stash, max_kicks=kicks, seed=1)
    bench = Bench(dut, rng, p_cmd=1.0, p_lookup=1.0, inflight_bias=0.6)
    simulate(dut, bench, forwarding_plan(bench, cap, 25))
    undo_cov = sum(c.cov for c in bench.log if c.status == FULL)
    print(f"{bench.cycles} cycles: lookups of a key written {bench.cov_cur}, overwritten {bench.cov_old}, "
          f"during undone walks {undo_cov}; {bench.collisions} collisions")
    assert bench.cov_cur >= 50 and bench.cov_old >= 10 and undo_cov >= 10


def test_load_and_insert_cycles():
    """Capacity 1024, 4 ways, stash 4, 128 kicks, keys as a NIC sees them (consecutive QPNs in
    four tenants): the first FULL comes above 90% load. Prints the average cycles per insert
    around 50% and 90% load (the benchmark measures them at 4096 and 16384)."""
    rng = seeded_rng("flowtable-load-1024", 1)
    cap = 1024
    dut = FlowTable(cap, ways=4, stash=4, max_kicks=128, seed=0)
    keys = (flow_key(t, 0x11 + q) for q in range(cap) for t in (1, 2, 3, 7))
    # Every command's key on the port a clock before ``valid`` (a source that registers it
    # first): the cycles are the walk's, without the re-read of a key that came with ``valid``.
    bench = Bench(dut, rng, p_cmd=1.0, p_lookup=0.5, new_keys=keys, p_early=1.0)
    simulate(dut, bench, fill_plan(bench, cap, fulls=1, side_ops=0), max_cycles=400_000)
    load = bench.full_loads[0] / cap
    stats = insert_stats(bench, cap)
    print(f"capacity {cap}: first FULL at load {load:.4f} ({bench.full_loads[0]} keys), "
          f"{bench.cycles} cycles; cycles per insert: "
          + ", ".join(f"{lo:.0%}-{hi:.0%}: {avg:.2f} ({n} inserts)" for (lo, hi), (avg, n) in stats.items()))
    assert load >= 0.9
    assert stats[(0.4, 0.6)][0] < 3


def test_elaborates_16384():
    """The default configuration at capacity 16384 converts to RTLIL (no simulation)."""
    dut = FlowTable(16384)
    assert dut.value_bits == 14 and dut.depth == 4096 and dut.addr_bits == 12
    ports = [Value.cast(v) for _path, _member, v in dut.signature.flatten(dut)]
    text = rtlil.convert(dut, ports=[p for p in ports if isinstance(p, Signal)])
    assert text.count("$meminit") >= 4 and "cell $mem" in text
