"""stellar.hdl.flow.hash: the flow-key hash in gateware equals its Python twin; outputs spread
evenly; structured keys (consecutive QPNs) fill a cuckoo table as well as random keys.

The gateware is simulated combinationally (one ``ctx.set`` per key) and compared with the
Python twin, which is itself checked against an independent definition (the H3 matrix product
over the one-hot nibble expansion, computed bit by bit from ``rows``).
"""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator
from stellar.hdl.flow.fields import FLOW_KEY, flow_key
from stellar.hdl.flow.hash import FlowHash, flow_hashes, slot_addresses
from stellar.sim.amaranth_streams import run_seeds, seeded_rng


def one_hot_nibbles(key):
    """128 bits: bit 16 j + v set when nibble j of the key is v."""
    return sum(1 << (16 * j + ((key >> (4 * j)) & 15)) for j in range(8))


def matrix_product(rows, key):
    """Output bit i = XOR over b of (row_i bit b AND x bit b), x the one-hot expansion."""
    x = one_hot_nibbles(key)
    out = 0
    for i, row in enumerate(rows):
        bit = 0
        for b in range(128):
            bit ^= (row >> b) & (x >> b) & 1
        out |= bit << i
    return out


@pytest.mark.parametrize("seed", run_seeds([0, 1]))
@pytest.mark.parametrize("capacity,ways", [(16, 2), (4096, 4), (16384, 4), (1024, 8)])
def test_gateware_equals_python(capacity, ways, seed):
    """Random keys (and the all-zero, all-one and single-bit keys) hash to the same address in
    the simulated gateware, in the Python twin and in the plain matrix product, for every way."""
    rng = seeded_rng(f"flowhash-gw-{capacity}-{ways}", seed)
    hashes = flow_hashes(capacity, ways, seed)
    bits = (capacity // ways).bit_length() - 1
    assert all(h.out_bits == bits and h.in_bits == FLOW_KEY.width == 32 for h in hashes)
    m = Module()
    key = Signal(32)
    outs = [Signal(bits, name=f"h{w}") for w in range(ways)]
    m.d.comb += [o.eq(h.gateware(key)) for o, h in zip(outs, hashes, strict=True)]
    keys = [0, 0xFFFFFFFF] + [1 << j for j in range(32)] + [rng.getrandbits(32) for _ in range(150)]
    got = []
    sim = Simulator(m)

    async def testbench(ctx):
        for k in keys:
            ctx.set(key, k)
            got.append([ctx.get(o) for o in outs])

    sim.add_testbench(testbench)
    sim.run()
    for k, g in zip(keys, got, strict=True):
        want = slot_addresses(hashes, k)
        assert g == want, f"key {k:#010x}: gateware {g}, python {want}"
        assert want == [matrix_product(h.rows, k) for h in hashes]


def test_tables_seeded_and_nonlinear():
    """The tables of a way depend only on (seed, way) -- the same from any two constructions,
    different between ways and between seeds -- and the hash is not linear in the key bits
    (a linear hash keeps the structure of consecutive keys; see the module docstring)."""
    a, b = flow_hashes(4096, 4, 0), flow_hashes(4096, 4, 0)
    assert [h.tables for h in a] == [h.tables for h in b]
    assert len({h.tables for h in a}) == 4
    assert {h.tables for h in a}.isdisjoint(h.tables for h in flow_hashes(4096, 4, 1))
    assert FlowHash(32, 10, seed=0, way=2).tables == a[2].tables
    rng = random.Random(3)
    for h in a:
        assert h.out_bits == 10 and len(h.tables) == 8
        pairs = [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(50)]
        assert sum(h(x ^ y) ^ h(0) != h(x) ^ h(y) for x, y in pairs) > 40


def chi_square(counts, expected):
    return sum((c - expected) ** 2 / expected for c in counts)


@pytest.mark.parametrize("keys_kind", ["random", "sequential_qpn", "tenants"])
def test_spread_even(keys_kind):
    """Bucket counts of 32768 keys over 1024 addresses per way: for random keys the chi-square
    statistic stays within 6 standard deviations of its mean (1023 degrees of freedom, sd ~45);
    consecutive QPNs of one tenant and the same QPNs in many tenants (the keys a real table
    holds) are a little over-dispersed under tabulation (sums over a product set), so their
    sanity bound is twice the mean; no bucket gets twice the mean count. The ways disagree on
    most keys, and a pair of keys colliding in one way rarely collides in another (about 8 of
    4096 random keys do; identical ways would make it all of them)."""
    rng = seeded_rng(f"flowhash-spread-{keys_kind}", 1)
    hashes = flow_hashes(4096, 4, 0)
    n, buckets = 32768, 1024
    if keys_kind == "random":
        keys = [rng.getrandbits(32) for _ in range(n)]
    elif keys_kind == "sequential_qpn":
        keys = [flow_key(5, 0x100 + i) for i in range(n)]
    else:
        keys = [flow_key(t, q) for t in range(256) for q in range(0x40, 0x40 + n // 256)]
    bound = buckets - 1 + 6 * (2 * (buckets - 1)) ** 0.5 if keys_kind == "random" else 2 * (buckets - 1)
    addrs = [[h(k) for k in keys] for h in hashes]
    for w, col in enumerate(addrs):
        counts = [0] * buckets
        for a in col:
            counts[a] += 1
        x2 = chi_square(counts, n / buckets)
        print(f"{keys_kind} way {w}: chi-square {x2:.0f} (bound {bound:.0f}), max bucket {max(counts)}")
        assert x2 < bound
        assert max(counts) < 2 * n / buckets
    # Different ways differ: the address in way 0 says nothing about the address in way 1.
    same = sum(a == b for a, b in zip(addrs[0], addrs[1], strict=True))
    assert same < 3 * n / buckets
    pairs = {}
    for a0, a1 in zip(addrs[0][:4096], addrs[1][:4096], strict=True):
        pairs.setdefault(a0, []).append(a1)
    both = sum(len(v) - len(set(v)) for v in pairs.values())
    print(f"{both} of 4096 keys collide with another in ways 0 and 1 together (expected ~8)")
    assert both < (24 if keys_kind == "random" else 64), f"{both} keys collide in way 0 and way 1 together"


def cuckoo_fill(hashes, capacity, keys, *, stash=4, max_kicks=128, rng):
    """Load at the first failed insert of the table's algorithm in Python: an empty way of the
    key, else a random walk (never back into the way just left) checking the carried key's
    other ways for room before each eviction, then the stash."""
    ways = len(hashes)
    table = [[None] * (capacity // ways) for _ in range(ways)]
    n = used = 0
    for k in keys:
        cur, frm = k, None
        for _kick in range(max_kicks + 1):
            room = [w for w in range(ways) if w != frm and table[w][hashes[w](cur)] is None]
            if room:
                table[room[0]][hashes[room[0]](cur)] = cur
                break
            if _kick == max_kicks:
                cur = None if used == stash else cur
                used += cur is not None
                break
            frm = rng.choice([w for w in range(ways) if w != frm])
            a = hashes[frm](cur)
            table[frm][a], cur = cur, table[frm][a]
        else:
            raise AssertionError
        if cur is None and _kick == max_kicks:
            return n / capacity
        n += 1
    return n / capacity


@pytest.mark.parametrize("keys_kind", ["random", "sequential_qpn", "tenants"])
def test_structured_keys_fill_the_table(keys_kind):
    """Consecutive QPNs of one tenant, and the same QPNs in many tenants, fill a 4096-slot 4-way
    table past 90% before the first failure, like random keys (a plain H3 hash, linear in the
    key bits, failed at 63-89% on such keys)."""
    rng = seeded_rng(f"flowhash-fill-{keys_kind}", 1)
    cap = 4096
    if keys_kind == "random":
        keys = rng.sample(range(1 << 32), 2 * cap)
    elif keys_kind == "sequential_qpn":
        keys = [flow_key(1, 0x100 + i) for i in range(2 * cap)]
    else:
        keys = [flow_key(t, q) for q in range(0x40, 0x40 + 2 * cap // 64) for t in range(64)]
    for seed in (0, 1):
        load = cuckoo_fill(flow_hashes(cap, 4, seed), cap, keys, rng=rng)
        print(f"{keys_kind}, seed {seed}: first failure at load {load:.4f}")
        assert load >= 0.9
