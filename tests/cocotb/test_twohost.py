"""``make sim``, the two-host system, as a test: two simulated hosts, each the host driver on a
NIC behind simulated PCIe (``stellar_pcie2``), RC traffic through a lossy switch; every byte and
completion checked inside the testbench (``stellar.sim.tb_twohost``), the summary checked here
against what was posted."""

import json

import pytest


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_twohost_sim(tmp_path, pause):
    from stellar.sim import twohost_sim
    pairs, messages = 2, 8
    rc = twohost_sim.main(["--messages", str(messages), "--pairs", str(pairs), "--loss", "0.02",
                           "--pause", str(pause), "--seed", "5" if pause else "3",
                           "--out", str(tmp_path)])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and s["problems"] == []
    wrs = sum(s["posted"].values())
    assert wrs == 2 * pairs * messages
    # one doorbell per list of at most 4 WRs, plus the receive doorbells: never more than one
    # MMIO write per work request, never an MMIO read while polling
    assert s["mmio_writes_per_wr"] <= 1.0 and all(m["reads"] == 0 for m in s["mmio"].values())
    for side in ("a", "b"):
        hq = s["hostq"][side]
        assert hq["sq_wqes"] == s["posted_by"][side], (side, hq)
        assert hq["cqes"] == s["completions"][side]["send"] + s["completions"][side]["recv"]
        assert hq["doorbell_invalid"] == 0 and hq["cqe_dropped"] == 0
    assert len(s["latency_cycles"]) == 8 and min(s["latency_cycles"]) > 0
