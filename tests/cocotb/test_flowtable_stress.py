"""cocotb + Verilator stress test of the flow table (``stellar_flowtable``) against a dict model.

Two configurations, each with its own Verilog and Verilator build so they run in parallel under
pytest-xdist: the default table (4096 slots, 4 ways, stash 4, 128 kicks) and a small one (256
slots, 2 ways, stash 2, 16 kicks) that refuses inserts (FULL) every few dozen commands and so
exercises the kick walk's undo path all the time. 110 000 commands in total, a checked lookup
every cycle (:mod:`stellar.sim.tb_flowtable`). ``STELLAR_SEED=<n>`` replays a seed; the seed of
each run is printed. The summary (load factor at the first FULL, mean cycles per insert) is
printed and kept in the run directory as ``flowtable_summary.json``.
"""

import functools
import json
import os

import pytest
from stellar.hdl.top.flowtable import TOP_NAME, verilog_top
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug

# (design parameters, commands)
CONFIGS = {
    "c4096": ({"capacity": 4096, "ways": 4, "stash": 4, "max_kicks": 128}, 50_000),
    "c256": ({"capacity": 256, "ways": 2, "stash": 2, "max_kicks": 16}, 60_000),
}


@functools.cache
def verilog_for(name):
    params, _ops = CONFIGS[name]
    return export_verilog(TOP_NAME, verilog_top, params)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_flowtable_stress(config):
    params, ops = CONFIGS[config]
    seed = int(os.environ["STELLAR_SEED"]) if "STELLAR_SEED" in os.environ else None
    ops = int(os.environ.get("STELLAR_TB_OPS", ops))     # scale from the shell
    results = run_cocotb(toplevel=TOP_NAME, verilog_sources=[verilog_for(config)],
                         test_module="stellar.sim.tb_flowtable", params_slug=param_slug(params),
                         testcase="stress", seed=seed,
                         extra_env=tb_env({**params, "ops": ops}))
    summary = json.loads((results.parent / "flowtable_summary.json").read_text())
    print(f"flow table {config}: {json.dumps(summary)}")
    assert summary["commands"] >= ops
