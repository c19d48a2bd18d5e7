"""stellar.hdl.flow.vlan: the VLAN -> tenant map in the Amaranth simulator, against a dict.

Host writes and reads interleaved at random with one lookup per clock (random idle cycles);
untagged frames and VID 0 (priority tag) always belong to tenant 0; a lookup in the clock of a
write to its VID may see the old or the new entry, never a mix.
"""

import pytest
from amaranth.sim import Simulator
from stellar.hdl.flow.vlan import VlanTenantMap
from stellar.sim.amaranth_streams import run_seeds, seeded_rng


@pytest.mark.parametrize("seed", run_seeds([1, 2]))
def test_lookups_against_model(seed):
    rng = seeded_rng("vlan-map", seed)
    dut = VlanTenantMap()
    vids = [0, 1, 2, 100, 4094, 4095] + [rng.randrange(4096) for _ in range(10)]
    table = {}            # vid -> (mapped, tenant)
    pending = []          # (cycle due, expected set of answers)
    reads = []            # (cycle due, expected entry)
    errors = []

    async def bench(ctx):
        for cycle in range(3000):
            # Results and read data of the previous clock.
            for _due, options in [p for p in pending if p[0] == cycle]:
                got = (ctx.get(dut.result.payload.mapped), ctx.get(dut.result.payload.tenant))
                if not ctx.get(dut.result.valid) or got not in options:
                    errors.append((cycle, got, options))
            for _due, want in [r for r in reads if r[0] == cycle]:
                got = (ctx.get(dut.rdata.mapped), ctx.get(dut.rdata.tenant))
                if got != want:
                    errors.append((cycle, "read", got, want))
            pending[:] = [p for p in pending if p[0] > cycle]
            reads[:] = [r for r in reads if r[0] > cycle]

            vid = rng.choice(vids)
            tagged = rng.random() < 0.8
            look = rng.random() < 0.8
            ctx.set(dut.lookup.valid, look)
            ctx.set(dut.lookup.payload.tagged, tagged)
            ctx.set(dut.lookup.payload.vid, vid)
            before = (1, 0) if not tagged or vid == 0 else table.get(vid, (0, 0))
            options = {before}
            cmd = rng.random() < 0.3
            ctx.set(dut.cmd.valid, cmd)
            if cmd:
                wvid = vid if rng.random() < 0.3 else rng.choice(vids)
                write = rng.random() < 0.6
                entry = (rng.randrange(2), rng.randrange(256))
                ctx.set(dut.cmd.payload.write, write)
                ctx.set(dut.cmd.payload.vid, wvid)
                ctx.set(dut.cmd.payload.entry.mapped, entry[0])
                ctx.set(dut.cmd.payload.entry.tenant, entry[1])
                if write:
                    if wvid == vid and tagged and vid != 0:
                        options.add(entry)
                    table[wvid] = entry
                else:
                    reads.append((cycle + 1, table.get(wvid, (0, 0))))
            if look:
                pending.append((cycle + VlanTenantMap.LATENCY, options))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert not errors, errors[:5]
