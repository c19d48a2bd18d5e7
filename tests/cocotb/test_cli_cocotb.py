"""``stellar`` end to end on the simulated two-host system (``--device sim``: a cocotb run of
``stellar_pcie2`` with ``stellar.sim.tb_cli``), run as a user runs it: a separate process, JSON
out, progress on stderr. Figures are checked against expectations computed here from what was
sent: bytes on the wire from the RoCEv2 header sizes, packets from the path MTU, counters from the
work requests, MMIO writes per work request from the list length.

(Named ``test_cli_cocotb`` because ``tests/host/test_cli.py`` holds the host-side tests and
pytest needs unique basenames.)
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from stellar.hdl.regmap import BLOCKS, VERSION

REPO = Path(__file__).resolve().parents[2]
MTU = 1024                      # stellar.host.perf.PerfPair and the warm-up connect at 1024
# RoCEv2 frame without FCS: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4; RETH 16 on the
# first packet of a WRITE and on a READ request
HEADERS, RETH = 58, 16


def stellar(*argv, pause=0.0, timeout=900):
    cmd = [sys.executable, "-m", "stellar.host.cli", "--json", "--pause", str(pause), *argv]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout), proc.stderr


def packets(n):
    return max(1, math.ceil(n / MTU))


def write_wire_bytes(n):
    """Frame bytes of one RDMA WRITE of ``n`` bytes (payloads here are multiples of 4)."""
    return n + packets(n) * HEADERS + RETH


@pytest.mark.parametrize("pause", [0.0, 0.3])
def test_perf_write_bw(pause):
    sizes, iters, depth, batch, sig = [64, 1024], 32, 16, 4, 8
    doc, err = stellar("perf", "write-bw", "--sizes", ",".join(map(str, sizes)), "--iters",
                       str(iters), "--tx-depth", str(depth), "--batch", str(batch),
                       "--signal-every", str(sig), pause=pause)
    assert doc["command"] == "perf" and doc["test"] == "write_bw"
    for size in sizes:       # the CLI showed the testbench's progress while it ran
        assert f"write_bw {size} B: {iters}/{iters} messages (100 %)" in err, err[-2000:]
    assert [run["result"]["size"] for run in doc["runs"]] == sizes
    wire = 0
    for run in doc["runs"]:
        r, c = run["result"], run["counters"]
        size = r["size"]
        assert (r["bytes"], r["messages"], r["verified"]) == (iters * size, iters, True)
        assert r["clock"] == "simulated" and r["hz"] == 250e6
        assert r["cycles"] == round(r["seconds"] * 250e6)
        assert r["gbps"] == pytest.approx(iters * size * 8 / r["seconds"] / 1e9)
        # a 64-bit datapath at 250 MHz carries 16 Gb/s, headers included
        assert 0 < r["gbps"] < 16 * size / (size + HEADERS + RETH)
        # one doorbell per list of `batch` WRs, completions polled from memory
        assert r["mmio_writes_per_wr"] == 1 / batch and r["mmio_reads"] == 0
        assert r["sq_doorbells"] == iters // batch and r["cq_doorbells"] == 0
        lat = r["latency"]
        assert lat["samples"] == iters // sig
        cyc = lat["cycles"]
        assert 0 < cyc["min"] <= cyc["median"] <= cyc["p99"] <= cyc["max"]
        # the device saw exactly this run's work (counters that did not move are left out)
        a, b = c["a"], c["b"]
        pkts = iters * packets(size)
        assert a["hostq.sq_wqes"] == iters and a["hostq.cqes"] == iters // sig
        assert a["hostq.doorbells"] == iters // batch
        assert a["transport.tx_packets"] == pkts and a["pktengine.tx_frames"] == pkts
        assert b["transport.rx_requests"] == pkts and b["mr.rx_mr_checks"] == iters
        assert "hostq.cqes" not in b, "a WRITE consumes no receive and completes nothing at B"
        for nic in (a, b):
            assert not {k for k in nic if "drop" in k or k.endswith(("retransmits", "timeouts",
                                                                       "qp_errors", "naks"))}, nic
        wire += iters * write_wire_bytes(size)
    switch = doc["simulated"]["switch"]
    assert switch["a->b"]["bytes_in"] == wire, "bytes on the wire = iterations x (size + headers)"
    assert switch["a->b"]["dropped"] == switch["b->a"]["dropped"] == 0
    # the tables a person reads come from the same document
    from stellar.host.cli import render
    table = render(doc)
    assert "RDMA WRITE bandwidth: 32 iterations, tx depth 16, 4 WR per list, 1 in 8 signaled" in table
    assert table.splitlines()[-1].split()[-3:] == ["0.250", "0.000", "yes"]


def test_info_and_stats():
    info, err = stellar("info")
    assert "warm-up traffic" in err
    names = [b.name for b in BLOCKS]
    devices = info["devices"]
    assert [d["name"] for d in devices] == ["a", "b"]
    for d, mac, ip in ((devices[0], "02:00:00:00:00:0a", "10.0.0.1"),
                       (devices[1], "02:00:00:00:00:0b", "10.0.0.2")):
        assert d["version"] == ".".join(map(str, VERSION)) and d["id"] == "0x53544c52"
        assert sorted(f["name"] for f in d["features"]) == sorted(names)
        assert d["hostq"]["qps"] == 16 and d["data_width"] == 64
        assert d["gids"] == [{"index": 0, "mac": mac, "ip": ip}]
        # the warm-up QP is the one in use
        assert d["qps"] == {"total": 16, "in_use": [{"index": 0, "qpn": 0x100, "state": "RTS"}]}
    from stellar.host.cli import render
    assert "QPs in use   1 of 16: 0x100 RTS" in render(info)

    stats, _err = stellar("stats")
    w = stats["warmup"]
    writes, reads, sends = w["write"], w["read"], w["send"]
    a, b = (d["counters"] for d in stats["devices"])
    wrs = len(writes) + len(reads) + len(sends)
    req_pkts = sum(packets(n) for n in writes + sends) + len(reads)
    # what A sent: every WR fetched and completed (all signaled), three lists, three doorbells
    assert a["hostq"]["sq_wqes"] == wrs and a["hostq"]["cqes"] == wrs
    assert a["transport"]["completions"] == wrs and a["hostq"]["doorbells"] == 3
    assert a["transport"]["tx_packets"] == req_pkts == b["transport"]["rx_requests"]
    assert a["pktengine"]["tx_frames"] == req_pkts == b["pktengine"]["rx_roce"]
    # what B did: receives for the SENDs, READ responses, R_Key checks per WRITE / READ
    assert b["hostq"]["rq_wqes"] == len(sends) == b["hostq"]["cqes"] == b["transport"]["completions"]
    assert b["hostq"]["doorbells"] == 1
    assert b["transport"]["tx_read_responses"] == sum(packets(n) for n in reads)
    assert b["mr"]["rx_mr_checks"] == len(writes) + len(reads)
    for nic in (a, b):
        assert nic["transport"]["retransmits"] == nic["transport"]["qp_errors"] == 0
        assert all(v == 0 for blk in nic.values() for k, v in blk.items() if "drop" in k), nic
    # and the wire agrees
    sw = stats["simulated"]["switch"]
    wire = (sum(write_wire_bytes(n) for n in writes) + len(reads) * (HEADERS + RETH)
            + sum(n + packets(n) * HEADERS for n in sends))
    assert sw["a->b"]["frames_in"] == req_pkts and sw["a->b"]["bytes_in"] == wire
    assert sw["b->a"]["frames_in"] == a["pktengine"]["rx_frames"]
    table = render(stats)
    assert table.splitlines()[0].split() == ["counter", "a", "b"]
    assert any(line.split() == ["hostq.sq_wqes", str(wrs), "0"] for line in table.splitlines())
