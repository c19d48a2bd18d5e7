"""cocotb + Verilator tests of ``stellar_rxflow`` (the RX flow pipeline) at both data widths,
and the ``make sim`` job that runs it.

Each parameter set gets its own generated Verilog and Verilator build, so they run in parallel.
"""

import functools
import json

import pytest
from stellar.hdl.top.rxflow import TOP_NAME, verilog_top
from stellar.sim import packets, rxflow_sim, tshark
from stellar.sim.runner import run_cocotb, tb_env
from stellar.sim.verilog import export_verilog, param_slug

TESTS = ["host_tables", "multi_tenant_trace", "context_forwarding", "attack"]


@functools.cache
def verilog_for(width, qps):
    return export_verilog(TOP_NAME, verilog_top, {"width": width, "qps": qps})


@pytest.mark.parametrize("testcase", TESTS)
@pytest.mark.parametrize("width", [64, 512])
def test_rxflow(width, testcase):
    params = {"width": width, "qps": 4096}
    frames = 200 if width == 64 else 120
    run_cocotb(toplevel=TOP_NAME, verilog_sources=[verilog_for(width, 4096)],
               test_module="stellar.sim.tb_rxflow", params_slug=param_slug(params),
               testcase=testcase, extra_env=tb_env({**params, "frames": frames}))


def test_sim_job(tmp_path):
    """``make sim``: the multi-tenant trace with the attack; tshark dissects what passed."""
    assert rxflow_sim.main(["--frames", "150", "--seed", "5", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "annotations.json").read_text())
    attack = [r for r in rows if r["desc"].startswith("attack")]
    assert len(attack) >= 3 and not any(r["ann"]["passed"] for r in attack)
    sent = packets.read_pcap(tmp_path / "tx.pcap")
    assert len(sent) == sum(1 for r in rows if r["ann"]["passed"]) > 30
    assert tshark.expert_errors(tmp_path / "tx.pcap") == []
