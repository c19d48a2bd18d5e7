# Ref: A. Kirsch, M. Mitzenmacher, U. Wieder, "More robust hashing: cuckoo hashing with a stash",
#      SIAM J. Comput. 39 (2009) (load thresholds of d-ary cuckoo tables)
"""cocotb benchmark of the flow table: exact cycle counts, written as JSON (not a test).

Run by :mod:`stellar.sim.bench_flow` (``make bench``) on ``stellar_flowtable``
(:func:`stellar.sim.bench_tops.flowtable_top`) through :func:`stellar.sim.runner.run_cocotb`,
one Verilator build per capacity. One cocotb test, ``bench_flow``, does one *run* per key
stream: the DUT is reset (empty table), then

``fill``   the host inserts distinct keys, one command issued the cycle after the previous
           response (the fastest the command port allows), until the first FULL answer.
``idle``   ``idle_cycles`` cycles with no command (the table left as the fill left it).
``churn``  (first run of a capacity only) ``churn`` pairs of DELETE of a stored key and INSERT
           of a new one, at the load the fill reached: deletes re-home stash entries, inserts
           walk long paths, and both move entries under the lookups.
``empty``  every stored key deleted, in random order, until ``occupancy`` and ``stash_used``
           are 0. Reset clears the registers but not the block RAMs, so this is also what
           gives the next run an empty table.

In every cycle of all three phases a lookup is presented (the port has no backpressure): half
of them a stored key, a tenth the key of the command in progress, the rest a fresh random key
(almost always absent). Each result is paired with its lookup by the tag (the lookup's cycle
mod 256), which gives the exact latency, and checked against a dict model of the table: a key
whose command answered before the lookup's cycle must hit with its value, any other key must
miss; only the key of the command in progress (from the cycle its command is presented through
its response cycle) may go either way. So a lookup rate is never reported for wrong answers.

Key streams (``(tenant, qpn)``, distinct within a run): ``random`` (uniform over the 32-bit key
space, seeded) and ``sequential`` (16 tenants, each with QPNs 1, 2, 3, ... as a host would
allocate them: the structured case a weak hash fails on).

Measured per run: the load (keys stored / capacity) at the first FULL and at the first insert
that went to the stash; per insert, ``resp_cycles`` (the DUT's own count, cross-checked against
the cycles the bench saw between command and response) binned by the load before the insert in
10 % bands; per phase, lookups presented, results received, cycles and results per cycle; the
latency of every lookup; every wrong or missing answer, in ``errors``.

Parameters (``STELLAR_TB_*``, see :func:`stellar.sim.tb.tb_param`):
  ``capacity``     capacity the top was built with (checked against ``occupancy``'s width).
  ``runs``         comma-separated key streams: ``random:<seed>`` or ``sequential``.
  ``idle_cycles``  length of the idle phase.
  ``churn``        delete/insert pairs of the churn phase (0: none).
  ``out``          path of the JSON file to write.
"""

import json
import random
from collections import deque
from pathlib import Path

import cocotb
from cocotb.triggers import FallingEdge, RisingEdge
from stellar.hdl.flow.fields import QPN_BITS, TENANT_BITS, FlowOp, FlowStatus
from stellar.sim.bench_tops import FLOW_TAG_BITS
from stellar.sim.tb import TB, tb_param

__all__ = ["key_stream", "BANDS"]

BANDS = 10              # load bands of 10 %
SEQ_TENANTS = 16        # tenants of the sequential key stream
TAG_MASK = (1 << FLOW_TAG_BITS) - 1
MAX_ERRORS = 8          # the first few say what went wrong; the rest are noise


def key_stream(spec, salt=0):
    """Distinct ``(tenant, qpn)`` keys, endless: ``random:<seed>`` or ``sequential``.
    ``salt`` gives an independent random stream (the absent keys lookups probe for)."""
    if spec == "sequential":
        i = 0
        while True:
            yield i % SEQ_TENANTS, 1 + i // SEQ_TENANTS
            i += 1
    kind, _, seed = spec.partition(":")
    if kind != "random" or not seed.isdigit():
        raise ValueError(f"unknown key stream {spec!r}: random:<seed> or sequential")
    rng = random.Random(f"flow-bench:{seed}:{salt}")
    seen = set()
    while True:
        key = rng.getrandbits(TENANT_BITS), rng.getrandbits(QPN_BITS)
        if key not in seen:
            seen.add(key)
            yield key


class Phase:
    """Lookup statistics of one phase."""

    def __init__(self, name):
        self.name = name
        self.lookups = 0
        self.results = 0
        self.hits = 0
        self.checked = 0        # results compared with the model (not the in-flight key's)
        self.first = None       # cycle of the first lookup
        self.last = None        # cycle of the last lookup

    def summary(self):
        cycles = 0 if self.first is None else self.last - self.first + 1
        return {"lookups": self.lookups, "results": self.results, "cycles": cycles,
                "hits": self.hits, "checked": self.checked,
                # Rounded for reading; the counts above are exact.
                "results_per_cycle": round(self.results / cycles, 4) if cycles else None}


class FlowBench:
    """One cycle loop driving both ports of the table and checking every answer."""

    def __init__(self, dut, capacity, rng):
        self.dut = dut
        self.capacity = capacity
        self.rng = rng
        self.cycle = 0
        self.model = {}                 # key -> value, as the table answers after a response
        self.keys = []                  # the model's keys, for uniform picks
        self.index = {}                 # key -> position in self.keys
        self.pending = None             # key of the command in progress (ambiguous to lookups)
        self.cmd = None                 # (op, key, value) presented, not yet transferred
        self.issued = None              # cycle the command in progress transferred
        self.inflight = deque()         # (cycle, key, expected value or None for a miss, check)
        self.phase = None
        self.latency = {}
        self.errors = []
        self.mismatched_cycles = 0      # resp_cycles differing from the cycles the bench saw
        self.absent = None              # key stream of the lookups of absent keys
        self.occupancy = 0              # occupancy and stash_used as the last command was taken
        self.stash_used = 0
        d = dut
        self.h_lk = (d.lookup_valid, d.lookup_tenant, d.lookup_qpn, d.lookup_tag)
        self.h_res = (d.result_valid, d.result_hit, d.result_value, d.result_tag)
        self.h_cmd = (d.cmd_valid, d.cmd_op, d.cmd_tenant, d.cmd_qpn, d.cmd_value)
        self.h_resp = (d.resp_valid, d.resp_status, d.resp_value, d.resp_cycles)

    def error(self, text):
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"cycle {self.cycle}: {text}")
        elif len(self.errors) == MAX_ERRORS:
            self.errors.append("... more errors not listed")

    # -- model ---------------------------------------------------------------------------------

    def add(self, key, value):
        self.model[key] = value
        self.index[key] = len(self.keys)
        self.keys.append(key)

    def remove(self, key):
        del self.model[key]
        pos = self.index.pop(key)
        last = self.keys.pop()
        if last != key:
            self.keys[pos] = last
            self.index[last] = pos

    # -- one clock cycle -----------------------------------------------------------------------

    def _lookup_key(self):
        r = self.rng.random()
        if r < 0.5 and self.keys:
            return self.keys[self.rng.randrange(len(self.keys))]
        if r < 0.6 and self.pending is not None:
            return self.pending
        return next(self.absent)

    async def step(self):
        """One cycle: present a lookup (and the command, if any) after the rising edge, sample
        every output at the falling edge. Returns the response ``(status, value, cycles)`` of
        this cycle, or None."""
        valid, tenant, qpn, tag = self.h_lk
        key = self._lookup_key()
        valid.value = 1
        tenant.value, qpn.value = key
        tag.value = self.cycle & TAG_MASK
        check = key != self.pending
        ph = self.phase
        self.inflight.append((self.cycle, key, self.model.get(key), check, ph))
        ph.lookups += 1
        if ph.first is None:
            ph.first = self.cycle
        ph.last = self.cycle
        c_valid, c_op, c_tenant, c_qpn, c_value = self.h_cmd
        if self.cmd is not None:
            op, ckey, cval = self.cmd
            c_valid.value = 1
            c_op.value = op
            c_tenant.value, c_qpn.value = ckey
            c_value.value = cval
        else:
            c_valid.value = 0

        await FallingEdge(self.dut.clk)
        if self.cmd is not None and self.dut.cmd_ready.value:
            self.issued = self.cycle
            self.cmd = None
            # Sampled as the command is taken: every earlier command's updates are in.
            self.occupancy = self.dut.occupancy.value.to_unsigned()
            self.stash_used = self.dut.stash_used.value.to_unsigned()
            if self.occupancy != len(self.model):
                self.error(f"occupancy {self.occupancy}, the model holds {len(self.model)} keys")
        self._result()
        resp = None
        if self.h_resp[0].value:
            resp = self._response()
        await RisingEdge(self.dut.clk)
        self.cycle += 1
        return resp

    def _result(self):
        r_valid, r_hit, r_value, r_tag = self.h_res
        if not r_valid.value:
            return
        if not self.inflight:
            self.error("result without a lookup")
            return
        lcycle, key, expect, check, phase = self.inflight.popleft()
        phase.results += 1
        lat = self.cycle - lcycle
        self.latency[lat] = self.latency.get(lat, 0) + 1
        tag = r_tag.value.to_unsigned()
        if tag != lcycle & TAG_MASK:
            self.error(f"result tag {tag} but the oldest lookup was presented in cycle {lcycle}")
        hit = bool(r_hit.value)
        phase.hits += hit
        if not check:
            return
        phase.checked += 1
        if expect is None and hit:
            self.error(f"lookup {key} (cycle {lcycle}) hit value {r_value.value.to_unsigned()}, "
                       f"the key is not stored")
        elif expect is not None and (not hit or r_value.value.to_unsigned() != expect):
            got = f"value {r_value.value.to_unsigned()}" if hit else "a miss"
            self.error(f"lookup {key} (cycle {lcycle}) gave {got}, stored value {expect}")

    def _response(self):
        _valid, status, value, cycles = self.h_resp
        st, val, cyc = status.value.to_unsigned(), value.value.to_unsigned(), cycles.value.to_unsigned()
        if self.issued is None:
            self.error("response without a command")
        elif cyc != self.cycle - self.issued and cyc != 0xFFFF:
            self.mismatched_cycles += 1
            self.error(f"resp_cycles {cyc} but the bench counted {self.cycle - self.issued}")
        self.issued = None
        return FlowStatus(st), val, cyc

    async def command(self, op, key, value=0):
        """Present one command the next cycle, run until its response; ``(status, value,
        cycles, keys stored before, stash entries used before)``. The model follows the answer."""
        stored = len(self.model)
        self.cmd = (op, key, value)
        self.pending = key
        for _ in range(1 << 17):
            resp = await self.step()
            if resp is not None:
                break
        else:
            self.error(f"no response to {op.name} {key}")
            raise TimeoutError(self.errors[-1])
        status, val, cyc = resp
        self.pending = None
        if status == FlowStatus.OK:
            if op == FlowOp.INSERT:
                self.add(key, value)
            else:
                self.remove(key)
        elif not (op == FlowOp.INSERT and status == FlowStatus.FULL):
            self.error(f"{op.name} {key}: unexpected {status.name}")
        return status, val, cyc, stored, self.stash_used

    async def drain(self):
        """Clock with no lookups until every result is in (end of a run)."""
        self.h_lk[0].value = 0
        self.h_cmd[0].value = 0
        for _ in range(64):
            if not self.inflight:
                return
            await FallingEdge(self.dut.clk)
            self._result()
            await RisingEdge(self.dut.clk)
            self.cycle += 1
        self.error(f"{len(self.inflight)} lookups never answered")


def _bands(samples, capacity):
    """Per 10 % load band: inserts, mean and max ``resp_cycles``."""
    out = []
    for b in range(BANDS):
        cyc = [c for occ, c in samples if min(BANDS - 1, occ * BANDS // capacity) == b]
        out.append({"band": f"{10 * b}-{10 * b + 10}%", "inserts": len(cyc),
                    "mean": round(sum(cyc) / len(cyc), 2) if cyc else None,
                    "max": max(cyc) if cyc else None})
    return out


async def one_run(tb, dut, capacity, spec, idle_cycles, churn):
    await tb.reset()
    bench = FlowBench(dut, capacity, random.Random(f"flow-bench-lookups:{spec}"))
    bench.absent = key_stream(spec if spec != "sequential" else "random:0", salt=1)
    keys = key_stream(spec)
    phases = {}

    bench.phase = phases["fill"] = Phase("fill")
    samples, first_stash, full = [], None, None
    value = 0
    while full is None:
        key = next(keys)
        status, _v, cyc, occ, stash = await bench.command(FlowOp.INSERT, key, value % capacity)
        samples.append((occ, cyc))
        if stash and first_stash is None:
            first_stash = occ       # the insert before this one went to the stash
        if status == FlowStatus.FULL:
            full = {"stored": len(bench.model), "cycles": cyc, "stash_used": stash}
        else:
            value += 1
    ok_samples = samples[:-1]   # the FULL answer (a walk and its undo) is reported on its own

    bench.phase = phases["idle"] = Phase("idle")
    for _ in range(idle_cycles):
        await bench.step()

    churn_stats = None
    if churn:
        bench.phase = phases["churn"] = Phase("churn")
        dels, ins, full_count = [], [], 0
        for _ in range(churn):
            victim = bench.keys[bench.rng.randrange(len(bench.keys))]
            gone_value = bench.model[victim]
            _s, _v, cyc, _o, _st = await bench.command(FlowOp.DELETE, victim)
            dels.append(cyc)
            status, _v, cyc, _o, _st = await bench.command(FlowOp.INSERT, next(keys), gone_value)
            ins.append(cyc)
            full_count += status == FlowStatus.FULL
        churn_stats = {
            "pairs": churn, "load": round(len(bench.model) / capacity, 4), "insert_full": full_count,
            "delete_cycles": {"mean": round(sum(dels) / len(dels), 2), "max": max(dels)},
            "insert_cycles": {"mean": round(sum(ins) / len(ins), 2), "max": max(ins)},
        }
    bench.phase = phases["empty"] = Phase("empty")
    dels = []
    while bench.keys:
        victim = bench.keys[bench.rng.randrange(len(bench.keys))]
        _s, _v, cyc, _o, _st = await bench.command(FlowOp.DELETE, victim)
        dels.append(cyc)
    await bench.drain()
    left = dut.occupancy.value.to_unsigned(), dut.stash_used.value.to_unsigned()
    if left != (0, 0):
        bench.error(f"after deleting every key: occupancy {left[0]}, stash_used {left[1]}")

    cyc = [c for _o, c in ok_samples]
    return {
        "capacity": capacity, "keys": spec, "ok": not bench.errors, "errors": bench.errors,
        "stored_at_full": full["stored"],
        "load_at_full": round(full["stored"] / capacity, 4),
        "stash_at_full": full["stash_used"],
        "full_answer_cycles": full["cycles"],
        "load_at_first_stash": None if first_stash is None else round(first_stash / capacity, 4),
        "inserts": len(ok_samples),
        "insert_cycles": {"mean": round(sum(cyc) / len(cyc), 3), "max": max(cyc),
                          "total": sum(cyc), "bands": _bands(ok_samples, capacity)},
        "phases": {name: ph.summary() for name, ph in phases.items()},
        "latency": {"min": min(bench.latency), "max": max(bench.latency),
                    "histogram": {str(k): v for k, v in sorted(bench.latency.items())}},
        "churn": churn_stats,
        "empty_delete_cycles": {"deletes": len(dels), "mean": round(sum(dels) / len(dels), 3),
                                "max": max(dels)},
        "resp_cycles_mismatches": bench.mismatched_cycles,
        "sim_cycles": bench.cycle,
    }


@cocotb.test()
async def bench_flow(dut):
    """Flow table: lookups per cycle and latency (idle, under inserts, under churn), load at
    the first FULL, cycles per insert by load band."""
    capacity = tb_param("capacity")
    assert len(dut.occupancy) == (capacity - 1).bit_length() + 1, "built with another capacity"
    runs = [r for r in tb_param("runs", str).split(",") if r]
    idle_cycles, churn, out = tb_param("idle_cycles"), tb_param("churn"), tb_param("out", str)
    tb = TB(dut)
    for h in ("lookup_valid", "cmd_valid"):
        getattr(dut, h).value = 0
    results = []
    for i, spec in enumerate(runs):
        res = await one_run(tb, dut, capacity, spec, idle_cycles, churn if i == 0 else 0)
        results.append(res)
        ph = res["phases"]
        tb.log.info("BENCH flow c%d %s: load %.4f at first FULL (%d keys, stash %d), first stash "
                    "at %s; insert cycles mean %.2f max %d; results/cycle %s; latency %d..%d%s",
                    capacity, spec, res["load_at_full"], res["stored_at_full"], res["stash_at_full"],
                    res["load_at_first_stash"], res["insert_cycles"]["mean"], res["insert_cycles"]["max"],
                    " ".join(f"{k} {v['results']}/{v['cycles']}" for k, v in ph.items()),
                    res["latency"]["min"], res["latency"]["max"],
                    "" if res["ok"] else "; ERRORS: " + " | ".join(res["errors"]))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
