# Ref: IBTA Vol 1 ch. 10.6 (memory regions, L_Key/R_Key), ch. 9.7 (responder R_Key / bounds checks)
"""stellar.hdl.flow.mr: the MR table and its check pipelines in the Amaranth simulator.

The expectation is ``ref_check`` below, written from the block's contract (key -> index and
tag, tenant and PD, access flags, bounds on unbounded integers, page-list translation, zero
length, the order of the reasons) with Python integers and ``fields.MR_ENTRY.unpack``, not from
the gateware. Tables are loaded and read back through the ``cmd`` port only. Every stream is
driven with random idle cycles (``cmd`` also sees the block's own backpressure) and every result
is compared field by field, at exactly ``LATENCY`` clocks after its request.
"""

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Const
from amaranth.sim import Simulator
from stellar.hdl.flow.fields import MR_ENTRY, Access, MrReason, make_key, split_key
from stellar.hdl.flow.mr import MrOp, MrProtection, check_layout, cmd_layout, result_layout
from stellar.sim.amaranth_streams import ItemSource, pack_struct, run_seeds, run_streams, seeded_rng

M64 = (1 << 64) - 1
TENANTS = [0, 1, 7, 255]
PDS = [0, 1, 0x1234, 0xFFFF]

# --------------------------------------------------------------------------------------------
# Reference model
# --------------------------------------------------------------------------------------------


def ref_check(entries, pages, req):
    """The answer to one request against the table ``entries`` / ``pages`` (lists of ints).
    Returns (result fields, case) where the case names the path taken, for coverage."""
    def deny(reason, case):
        return {"allowed": 0, "reason": reason, "bus_addr": 0, "span": 0}, case

    va, length = req["va"], req["length"]
    if length == 0:
        return {"allowed": 1, "reason": MrReason.OK, "bus_addr": 0, "span": 0}, "zero"
    index, tag = split_key(req["key"])
    if index >= len(entries):
        return deny(MrReason.BAD_KEY, "index")
    e = MR_ENTRY.unpack(entries[index])
    if not e["valid"]:
        return deny(MrReason.BAD_KEY, "invalid")
    if e["tag"] != tag:
        return deny(MrReason.BAD_KEY, "stale")
    if e["tenant"] != req["tenant"] or e["pd"] != req["pd"]:
        return deny(MrReason.PD_TENANT, "pd_tenant")
    if req["access"] & ~e["access"]:
        return deny(MrReason.ACCESS, "access")
    if not (e["va"] <= va and va + length <= e["va"] + e["length"]):
        return deny(MrReason.BOUNDS, "range")
    if not e["page_list"]:
        bus = (e["bus_base"] + (va - e["va"])) & M64
        return {"allowed": 1, "reason": MrReason.OK, "bus_addr": bus, "span": length}, "contig"
    size = 1 << e["page_shift"]
    first = e["va"] % size
    page = (va - e["va"] + first) // size
    row = e["pbl_index"] + page
    if row >= len(pages):
        return deny(MrReason.BOUNDS, "page_oob")
    within = va % size
    bus = pages[row] - pages[row] % size + within
    span = min(length, size - within)
    return ({"allowed": 1, "reason": MrReason.OK, "bus_addr": bus, "span": span},
            "page_split" if span < length else "page")


def pages_used(e):
    """Page-table rows a valid page-list entry refers to (clipped to 16 bits)."""
    if not (e["valid"] and e["page_list"]) or e["length"] == 0:
        return range(0)
    size = 1 << e["page_shift"]
    n = (e["va"] % size + e["length"] + size - 1) // size
    return range(e["pbl_index"], min(e["pbl_index"] + n, 1 << 16))


# --------------------------------------------------------------------------------------------
# Random tables and requests
# --------------------------------------------------------------------------------------------


def random_entry(rng, n_pages):
    page_list = rng.random() < 0.45
    va = rng.choice([rng.getrandbits(64), rng.getrandbits(40) & ~0xFFF, 0,
                     (1 << 64) - rng.randint(1, 1 << 20), (1 << 64) - (1 << 12)])
    e = {"valid": int(rng.random() < 0.85), "tag": rng.getrandbits(8),
         "tenant": rng.choice(TENANTS), "pd": rng.choice(PDS),
         "access": rng.choice([0xF, rng.getrandbits(4)]), "va": va,
         "page_list": int(page_list), "bus_base": rng.getrandbits(64)}
    if page_list:
        shift = rng.choice([0, 1, 3, 12, 21, 31])
        size = 1 << shift
        n = rng.randint(1, 6)
        e["length"] = rng.randint(max(1, (n - 1) * size), n * size)
        if shift < 12 and rng.random() < 0.15:     # more pages than a 16-bit page index
            e["length"] = rng.randint(1 << 17, 1 << 40) << shift
        used = (va % size + e["length"] + size - 1) // size
        e["page_shift"] = shift
        e["pbl_index"] = (rng.randrange(max(1, n_pages - used + 1)) if rng.random() < 0.7
                          else rng.randrange(1 << 16))
    else:
        e["length"] = rng.choice([rng.randint(1, 1 << 16), rng.randint(1, 1 << 34), 0, M64,
                                  rng.getrandbits(64), 1])
        e["page_shift"] = rng.getrandbits(5)     # junk: unused by a contiguous MR
        e["pbl_index"] = rng.getrandbits(16)
    return MR_ENTRY.pack(e)


def random_request(rng, entries, n_entries, hot=None):
    """A request aimed (mostly) at an entry, with boundary VAs and lengths."""
    index = rng.choice(hot) if hot else rng.randrange(n_entries)
    e = MR_ENTRY.unpack(entries[index])
    if rng.random() < 0.06:
        # Beyond the table, aimed like an entry it would alias if the index were truncated.
        index += n_entries * rng.randint(1, ((1 << 24) - 1 - index) // n_entries)
    tag = e["tag"] if rng.random() < 0.88 else (e["tag"] + rng.randint(1, 255)) & 0xFF
    good = rng.random() < 0.9
    tenant = e["tenant"] if good else rng.choice(TENANTS)
    pd = e["pd"] if good or rng.random() < 0.5 else rng.choice(PDS)
    access = e["access"] & rng.getrandbits(4) if rng.random() < 0.85 else rng.getrandbits(4)
    base, size = e["va"], e["length"]
    cap = max(1, min(size, (1 << 32) - 1))
    n = rng.choice([rng.randint(1, cap), rng.randint(1, min(cap, 64)), cap, 1])
    kind = rng.choice(["inside", "base", "end", "past", "before", "zero", "random", "wrap",
                       "inside", "end"])
    if kind == "base":
        va = base
    elif kind == "end":
        va = base + size - n
    elif kind == "past":
        va = base + size - n + 1
    elif kind == "before":
        va = base - 1
    elif kind == "zero":
        va, n = rng.getrandbits(64), 0
    elif kind == "random":
        va, n = rng.getrandbits(64), rng.getrandbits(32)
    elif kind == "wrap":
        va, n = (1 << 64) - rng.randint(1, 64), rng.randint(1, 128)
    else:
        va = base + rng.randint(0, max(0, size - n))
    return {"tenant": tenant, "pd": pd, "key": make_key(index, tag), "va": va & M64,
            "length": n & 0xFFFFFFFF, "access": access}


# --------------------------------------------------------------------------------------------
# Simulation helpers
# --------------------------------------------------------------------------------------------


def unpack_struct(layout, bits):
    return {name: (bits >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


class Monitor:
    """Watches an always-ready stream (a driver of ``run_streams``): every valid payload with
    the edge it was seen at; checks that the payload is 0 while valid is low."""

    drives = ()

    def __init__(self, stream, count):
        self.samples = (stream.valid, stream.payload.as_value())
        self.count = count
        self.seen = []

    @property
    def done(self):
        return len(self.seen) >= self.count

    @property
    def progress(self):
        return len(self.seen)

    def sampled(self, edge, values):
        valid, payload = values
        if valid:
            self.seen.append((edge, payload))
        else:
            assert payload == 0, f"edge {edge}: payload {payload:#x} while valid is low"



class Commands:
    """``commands`` ((MrOp, index, value) tuples) on ``cmd``, the answers on ``resp``."""

    def __init__(self, dut, commands, rng, *, p_valid=0.6):
        self.dut = dut
        self.commands = list(commands)
        self.src = ItemSource(dut.cmd, [pack_struct(cmd_layout(), {"op": op, "index": i, "data": v})
                                        for op, i, v in self.commands], rng=rng, p_valid=p_valid)
        self.mon = Monitor(dut.resp, len(self.commands))
        self.drivers = (self.src, self.mon)

    def check(self, entries, pages):
        """Replays the commands on the model (``entries``/``pages``, lists updated in place):
        every resp comes exactly LATENCY clocks after its command was taken, with the data read
        (0 for writes and for an index beyond the table); a command is taken only when the
        previous one has answered. Returns the model state after each command (index 0: before
        the first) and the edges at which the commands were taken."""
        L = self.dut.LATENCY
        taken = [t.cycle for t in self.src.transfers]
        assert len(taken) == len(self.commands) == len(self.mon.seen)
        assert [e for e, _ in self.mon.seen] == [t + L for t in taken], "resp timing"
        assert all(b - a >= L for a, b in zip(taken, taken[1:], strict=False)), "taken while busy"
        states = [(list(entries), list(pages))]
        for (op, index, value), (_edge, resp) in zip(self.commands, self.mon.seen, strict=True):
            expect = 0
            if op == MrOp.WRITE_ENTRY and index < len(entries):
                entries[index] = value
            elif op == MrOp.WRITE_PAGE and index < len(pages):
                pages[index] = value & M64
            elif op == MrOp.READ_ENTRY and index < len(entries):
                expect = entries[index]
            elif op == MrOp.READ_PAGE and index < len(pages):
                expect = pages[index]
            assert resp == expect, f"{op.name} {index}: resp {resp:#x}, expected {expect:#x}"
            states.append((list(entries), list(pages)))
        return states, taken


class Checks:
    """Requests (dicts) on ``check[port]`` with random tags; the answers on ``result[port]``."""

    def __init__(self, dut, port, reqs, rng, *, p_valid=0.7):
        self.dut = dut
        self.port = port
        self.reqs = list(reqs)
        self.tags = [rng.getrandbits(dut.tag_bits) for _ in self.reqs]
        layout = check_layout(dut.tag_bits)
        self.src = ItemSource(dut.check[port], [pack_struct(layout, {**q, "tag": t})
                                                for q, t in zip(self.reqs, self.tags, strict=True)],
                              rng=rng, p_valid=p_valid)
        self.mon = Monitor(dut.result[port], len(self.reqs))
        self.drivers = (self.src, self.mon)

    def check(self, expect):
        """Every request is taken at once and answered exactly LATENCY clocks later, by one of
        the answers ``expect(i, edge)`` lists ((fields, case) pairs), compared field by field.
        Returns the case of each answer."""
        L = self.dut.LATENCY
        layout = result_layout(self.dut.tag_bits)
        edges = [t.cycle for t in self.src.transfers]
        assert len(edges) == len(self.reqs), "a request was not taken"
        assert [e for e, _ in self.mon.seen] == [e + L for e in edges], \
            f"checker {self.port}: answers not exactly LATENCY = {L} clocks after the requests"
        cases = []
        for i, (edge, bits) in enumerate(self.mon.seen):
            got = unpack_struct(layout, bits)
            assert got.pop("tag") == self.tags[i], f"checker {self.port} request {i}: tag"
            options = expect(i, edges[i])
            for want, case in options:
                if got == want:
                    cases.append(case)
                    break
            else:
                want, case = options[0]
                diff = {k: (hex(got[k]), hex(want[k])) for k in want if got[k] != want[k]}
                raise AssertionError(f"checker {self.port} request {i} at edge {edge} ({case}) "
                                     f"{self.reqs[i]}: (got, expected) {diff}")
        return cases


def simulate_phases(dut, *phases):
    """Runs phases (tuples of drivers) one after the other in ONE simulation (the memories
    start empty in each simulation); edges are numbered from 0 in each phase."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def testbench(ctx):
        for drivers in phases:
            await run_streams(ctx, *drivers, tail=dut.LATENCY + 4)

    sim.add_testbench(testbench)
    sim.run()


def random_table(rng, n_entries, n_pages):
    return ([random_entry(rng, n_pages) for _ in range(n_entries)],
            [rng.getrandbits(64) for _ in range(n_pages)])


def loader(dut, entries, pages, rng):
    commands = ([(MrOp.WRITE_PAGE, i, v) for i, v in enumerate(pages)]
                + [(MrOp.WRITE_ENTRY, i, v) for i, v in enumerate(entries)])
    rng.shuffle(commands)
    return Commands(dut, commands, rng, p_valid=0.8)


def check_loaded(load, entries, pages):
    states, _ = load.check([0] * len(entries), [0] * len(pages))
    assert states[-1] == (entries, pages)


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------

# (entries, pages, checkers, tag_bits): the second has two checkers, a page table whose size is
# not a power of two and a request tag.
CONFIGS = [(64, 64, 1, 0), (64, 48, 2, 5)]
ALL_CASES = {"zero", "index", "invalid", "stale", "pd_tenant", "access", "range", "contig", "page",
             "page_split", "page_oob"}


@pytest.mark.parametrize("seed", run_seeds([1, 2, 3]))
@pytest.mark.parametrize("n_entries,n_pages,checkers,tag_bits", CONFIGS)
def test_random_checks(n_entries, n_pages, checkers, tag_bits, seed):
    """A random table (contiguous and page-list MRs, several tenants and PDs, MRs that end past
    2**64) loaded through ``cmd``, then random requests on every check port at once, each with
    its own random idle cycles: stale tags, indices beyond the table, other tenants and PDs,
    missing rights, VAs at the base, at the end, one byte past, one byte before, zero length,
    wrap-around at 2**64. Every answer matches the model field by field exactly LATENCY clocks
    after its request (so the checkers answer independently), and every MrReason and every
    path of the model is reached."""
    rng = seeded_rng(f"mr-random-{n_entries}-{n_pages}-{checkers}", seed)
    dut = MrProtection(n_entries, n_pages, checkers=checkers, tag_bits=tag_bits)
    entries, pages = random_table(rng, n_entries, n_pages)
    load = loader(dut, entries, pages, rng)
    ports = [Checks(dut, n, [random_request(rng, entries, n_entries) for _ in range(300)], rng,
                    p_valid=[0.75, 0.5][n]) for n in range(checkers)]
    simulate_phases(dut, load.drivers, [d for c in ports for d in c.drivers])
    check_loaded(load, entries, pages)
    cases = set()
    for c in ports:
        cases |= set(c.check(lambda i, _edge, c=c: [ref_check(entries, pages, c.reqs[i])]))
    reasons = {ref_check(entries, pages, q)[0]["reason"] for c in ports for q in c.reqs}
    assert reasons == set(MrReason), f"reasons not reached: {set(MrReason) - reasons}"
    assert cases == ALL_CASES, f"model paths not reached: {ALL_CASES - cases}"


def test_full_rate_two_checkers():
    """Both checkers take a request every clock (no idle cycle) for the same and for different
    keys: every answer is exactly LATENCY clocks after its request, one per clock, each port's
    answers are its own requests' (the streams differ, so a swap would fail)."""
    rng = seeded_rng("mr-full-rate", 11)
    n_entries, n_pages = 32, 64
    dut = MrProtection(n_entries, n_pages, checkers=2, tag_bits=8)
    entries, pages = random_table(rng, n_entries, n_pages)
    load = loader(dut, entries, pages, rng)
    a = [random_request(rng, entries, n_entries) for _ in range(200)]
    b = [q if rng.random() < 0.3 else random_request(rng, entries, n_entries) for q in a]
    ports = [Checks(dut, 0, a, rng, p_valid=1.0), Checks(dut, 1, b, rng, p_valid=1.0)]
    simulate_phases(dut, load.drivers, [d for c in ports for d in c.drivers])
    check_loaded(load, entries, pages)
    for c in ports:
        c.check(lambda i, _edge, c=c: [ref_check(entries, pages, c.reqs[i])])
        edges = [t.cycle for t in c.src.transfers]
        assert edges == list(range(edges[0], edges[0] + len(edges))), "a request was not taken"
        assert edges[0] == 0
    assert dut.LATENCY <= 6


def test_readback():
    """Writes and reads of entries and pages in random order, with idle cycles, and indices
    beyond both tables (their writes are ignored and must not land on index mod size; they
    read as 0): every read returns the last value written, LATENCY clocks after the command,
    and cmd is not ready while a command is in progress."""
    rng = seeded_rng("mr-readback", 5)
    n_entries, n_pages = 32, 24
    dut = MrProtection(n_entries, n_pages)
    commands = []
    for _ in range(220):
        op = rng.choice(list(MrOp))
        limit = n_pages if op in (MrOp.READ_PAGE, MrOp.WRITE_PAGE) else n_entries
        index = rng.randrange(limit) if rng.random() < 0.85 else rng.choice(
            [limit + rng.randrange(limit), rng.randrange(limit, 1 << 16), (1 << 16) - 1])
        value = rng.getrandbits(MR_ENTRY.width) if op in (MrOp.WRITE_ENTRY, MrOp.WRITE_PAGE) else 0
        if op == MrOp.WRITE_PAGE and rng.random() < 0.5:
            value &= M64        # the page is bits 63:0; the rest of data is ignored
        commands.append((op, index, value))
    cmds = Commands(dut, commands, rng, p_valid=0.7)
    simulate_phases(dut, cmds.drivers)
    entries, pages = [0] * n_entries, [0] * n_pages
    cmds.check(entries, pages)
    assert sum(op == MrOp.READ_ENTRY and i < n_entries for op, i, _ in commands) > 20
    assert cmds.src.stalls > 0, "cmd never refused a command (ready when idle)"


@pytest.mark.parametrize("seed", run_seeds([1, 2]))
def test_host_writes_during_checks(seed):
    """The host rewrites a few hot entries (validity, tag, tenant, rights, bounds, kind) and
    edits pages no valid MR refers to (the documented discipline), with reads in between, while
    both checkers hammer the hot entries: a check taken before a write's edge answers from the
    old table, after it from the new one, and at the same edge from either, whole."""
    rng = seeded_rng("mr-host-writes", seed)
    n_entries, n_pages = 64, 64
    dut = MrProtection(n_entries, n_pages, checkers=2)
    entries, pages = random_table(rng, n_entries, n_pages)
    load = loader(dut, entries, pages, rng)

    kinds = [MR_ENTRY.unpack(e) for e in entries]
    paged = [i for i, e in enumerate(kinds) if e["valid"] and e["page_list"]]
    flat = [i for i, e in enumerate(kinds) if e["valid"] and not e["page_list"]]
    hot = rng.sample(paged, 3) + rng.sample(flat, 3)
    versions = {i: [entries[i]] for i in hot}
    st_e, st_p = list(entries), list(pages)
    commands = []
    while len(commands) < 90:
        r = rng.random()
        if r < 0.45:
            i = rng.choice(hot)
            v = random_entry(rng, n_pages)
            if rng.random() < 0.5:      # same key, new contents: only a whole-word read is right
                v = MR_ENTRY.pack({**MR_ENTRY.unpack(v), "tag": MR_ENTRY.unpack(st_e[i])["tag"],
                                   "valid": 1})
            versions[i].append(v)
            st_e[i] = v
            commands.append((MrOp.WRITE_ENTRY, i, v))
        elif r < 0.5:
            commands.append((MrOp.WRITE_ENTRY, n_entries + rng.choice(hot), rng.getrandbits(251)))
        elif r < 0.7:
            used = {p for e in st_e for p in pages_used(MR_ENTRY.unpack(e))}
            free = [p for p in range(n_pages) if p not in used]
            if free:
                p = rng.choice(free)
                st_p[p] = rng.getrandbits(64)
                commands.append((MrOp.WRITE_PAGE, p, st_p[p]))
        elif r < 0.85:
            commands.append((MrOp.READ_ENTRY, rng.choice(hot + [rng.randrange(1 << 16)]), 0))
        else:
            commands.append((MrOp.READ_PAGE, rng.randrange(n_pages + 4), 0))
    cmds = Commands(dut, commands, rng, p_valid=0.5)

    def aimed():
        aim = list(entries)
        i = rng.choice(hot)
        aim[i] = rng.choice(versions[i])
        return random_request(rng, aim, n_entries, hot=[i])

    # Enough checks to outlast the commands, one per LATENCY clocks at best (400 at LATENCY 5).
    ports = [Checks(dut, n, [aimed() for _ in range(80 * dut.LATENCY)], rng, p_valid=0.8)
             for n in range(2)]
    simulate_phases(dut, load.drivers, (*cmds.drivers, *(d for c in ports for d in c.drivers)))
    check_loaded(load, entries, pages)
    states, taken = cmds.check(list(entries), list(pages))
    assert taken[-1] < max(t.cycle for c in ports for t in c.src.transfers), "checks ended first"

    collisions, cases = 0, set()
    for c in ports:
        def expect(i, edge, c=c):
            nonlocal collisions
            old = sum(t < edge for t in taken)
            new = sum(t <= edge for t in taken)
            answers = [ref_check(*states[old], c.reqs[i])]
            if new != old:
                alt = ref_check(*states[new], c.reqs[i])
                if alt != answers[0]:
                    collisions += 1
                    answers.append(alt)
            return answers
        cases |= set(c.check(expect))
    assert {"contig", "page", "stale", "range"} <= cases
    print(f"checks whose answer changes with a write of the same edge: {collisions}")


def test_write_collision():
    """Directed: one entry rewritten every LATENCY clocks between two versions that differ in
    every field but the key (so a mix of old and new bits would give a third answer), while
    both checkers ask about it every clock. The answer switches exactly at the write's edge:
    old before it, new from it on (a check at the write's edge sees the new entry whole)."""
    rng = seeded_rng("mr-collision", 7)
    dut = MrProtection(16, 16, checkers=2)
    entries, pages = [0] * 16, [rng.getrandbits(64) for _ in range(16)]
    base = {"valid": 1, "tag": 0x5A, "tenant": 3, "pd": 9, "access": int(Access.REMOTE_WRITE)}
    v1 = MR_ENTRY.pack({**base, "va": 0x1000, "length": 0x2000, "bus_base": 0xAAAA_0000_0000})
    v2 = MR_ENTRY.pack({**base, "va": 0x1800, "length": 0x4000, "page_list": 1, "page_shift": 12,
                        "pbl_index": 4, "bus_base": 0x5555_0000_0000})
    entries[7] = v1
    load = loader(dut, entries, pages, rng)
    commands = [(MrOp.WRITE_ENTRY, 7, v2 if k % 2 == 0 else v1) for k in range(30)]
    cmds = Commands(dut, commands, rng, p_valid=1.0)
    req = {"tenant": 3, "pd": 9, "key": make_key(7, 0x5A), "va": 0x2400, "length": 0x900,
           "access": int(Access.REMOTE_WRITE)}
    ports = [Checks(dut, n, [req] * 130, rng, p_valid=1.0) for n in range(2)]
    simulate_phases(dut, load.drivers, (*cmds.drivers, *(d for c in ports for d in c.drivers)))
    check_loaded(load, entries, pages)
    states, taken = cmds.check(list(entries), list(pages))
    a1 = ref_check(*states[0], req)
    a2 = ref_check(*states[1], req)
    assert a1[1] == "contig" and a2[1] == "page" and a1[0] != a2[0]
    same_edge = 0
    for c in ports:
        def expect(i, edge):
            # The contract allows old or new at the write's edge; the block documents new
            # (transparent read ports), which is also what keeps block RAMs from giving a mix.
            nonlocal same_edge
            same_edge += edge in taken
            return [ref_check(*states[sum(t <= edge for t in taken)], req)]
        c.check(expect)
    assert same_edge >= 2 * 20


def test_contract():
    """The port contract other blocks are written against, and elaboration at the default
    sizes (1024 entries, 1024 pages) with two checkers."""
    assert MrProtection.LATENCY <= 6
    dut = MrProtection(checkers=2, tag_bits=6)
    widths = {"tenant": 8, "pd": 16, "key": 32, "va": 64, "length": 32, "access": 4, "tag": 6}
    assert {n: f.width for n, f in check_layout(6)} == widths
    assert {n: f.width for n, f in result_layout(6)} == {"allowed": 1, "reason": 3, "bus_addr": 64,
                                                         "span": 32, "tag": 6}
    assert {n: f.width for n, f in cmd_layout()} == {"op": 2, "index": 16, "data": MR_ENTRY.width}
    assert [int(op) for op in (MrOp.READ_ENTRY, MrOp.WRITE_ENTRY, MrOp.READ_PAGE,
                               MrOp.WRITE_PAGE)] == [0, 1, 2, 3]
    assert len(dut.check) == len(dut.result) == 2
    assert dut.check[1].signature.always_ready and dut.result[0].signature.always_ready
    assert not dut.cmd.signature.always_ready and dut.resp.signature.always_ready
    ports = [v.as_value() if hasattr(v, "as_value") else v
             for _path, _flow, v in dut.signature.flatten(dut)]
    text = rtlil.convert(dut, ports=[v for v in ports if not isinstance(v, Const)])
    assert "memory" in text or "$mem" in text


def test_page_table_edges():
    """Directed page-list corners: the last row of the table (allowed) and the row after it;
    a page index of 2**16 and more whose low 16 bits land inside the table; pbl_index 65535
    (the sum needs 17 bits); 1-byte pages and 2 GiB pages; an MR whose first byte is not on a
    page boundary (the first page is shorter); and an MR ending exactly at 2**64."""
    rng = seeded_rng("mr-page-edges", 3)
    n_entries, n_pages = 16, 24
    dut = MrProtection(n_entries, n_pages, checkers=1)
    pages = [rng.getrandbits(64) for _ in range(n_pages)]
    mrs = {
        1: {"page_shift": 0, "pbl_index": 2, "va": 0, "length": 1 << 40},
        2: {"page_shift": 12, "pbl_index": n_pages - 2, "va": 0x7000_0100, "length": 0x3000},
        3: {"page_shift": 12, "pbl_index": 0xFFFF, "va": 0x10_0000, "length": 0x1000},
        4: {"page_shift": 31, "pbl_index": 5, "va": (1 << 64) - (3 << 31) + 7,
            "length": (3 << 31) - 7},
        5: {"page_shift": 3, "pbl_index": 0, "va": 0x1005, "length": 8 * n_pages - 5},
    }
    entries = [0] * n_entries
    for i, f in mrs.items():
        entries[i] = MR_ENTRY.pack({"valid": 1, "tag": i, "tenant": 1, "pd": 2, "access": 0xF,
                                    "page_list": 1, **f})
    load = loader(dut, entries, pages, rng)

    def req(i, va, length):
        return {"tenant": 1, "pd": 2, "key": make_key(i, i), "va": va & M64, "length": length,
                "access": int(Access.REMOTE_READ)}
    base2 = mrs[2]["va"]
    base4 = mrs[4]["va"]
    cases = [
        (req(1, 21, 1), "page"),                    # row 23: the last one
        (req(1, 22, 1), "page_oob"),                # row 24: just past the table
        (req(1, (1 << 16) + 3, 1), "page_oob"),     # row 2**16 + 5: low bits inside the table
        (req(1, (5 << 16) - 2, 4), "page_oob"),
        (req(1, 0, 2), "page_split"),               # 1-byte pages: span 1
        (req(2, base2, 0x1000), "page_split"),      # first page is 0xF00 bytes
        (req(2, base2 + 0xF00, 0x1000), "page"),    # second page, row 23
        (req(2, base2 + 0x1F00, 0x1000), "page_oob"),
        (req(2, base2 + 0x1F00, 0x1101), "range"),
        (req(3, 0x10_0000, 0x10), "page_oob"),      # 0xFFFF + 0 beyond 24 rows
        (req(4, base4, 0x10), "page"),              # 2 GiB pages, MR ending at 2**64
        (req(4, (1 << 64) - 0x20, 0x20), "page"),
        (req(4, (1 << 64) - 0x20, 0x21), "range"),  # would wrap to 0x1
        (req(4, base4 - 1, 2), "range"),
        (req(5, 0x1005 + 8 * n_pages - 6, 1), "page"),
        (req(5, 0x1005 + 8 * n_pages - 5, 1), "range"),
        (req(5, 0x1005, 0), "zero"),
    ]
    port = Checks(dut, 0, [q for q, _ in cases], rng, p_valid=0.6)
    simulate_phases(dut, load.drivers, port.drivers)
    check_loaded(load, entries, pages)
    got = port.check(lambda i, _edge: [ref_check(entries, pages, port.reqs[i])])
    assert got == [case for _, case in cases]
