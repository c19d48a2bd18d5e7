"""``stellar`` (stellar.host.cli) and the perf routines (stellar.host.perf) without a device:
argument parsing, the collection functions on a fake register file, the tables, the perf loop on
a fake QP pair (its accounting checked against independent arithmetic), and the error paths of
the board and VFIO backends."""

import asyncio
import json
import mmap
import types

import pytest
from stellar.hdl.flow.fields import QP_CONTEXT, QpState
from stellar.hdl.regmap import MAGIC, REGMAP, encode_feature, encode_version
from stellar.host import cli, perf
from stellar.host.device import Device
from stellar.host.verbs import WcStatus

# ----------------------------------------------------------------------- a fake register file
BLOCKS = ("pktengine", "flow", "qpctx", "mr", "transport", "hostq")


class FakeRegs:
    """The register map of a device with ``BLOCKS``: constants, counters, GIDs, and the QP
    context window (command 1 loads ``contexts[index]`` into rdata*)."""

    def __init__(self, *, counters=None, contexts=None, blocks=BLOCKS):
        r = {}
        feats = [b for b in REGMAP.blocks if b.name in blocks]
        r[REGMAP["ident.id"].offset] = MAGIC
        r[REGMAP["ident.version"].offset] = encode_version(0, 1, 0)
        r[REGMAP["ident.feature_count"].offset] = len(feats)
        for i, b in enumerate(feats):
            r[REGMAP[f"ident.feature{i}"].offset] = encode_feature(b.feature, b.version, b.base)
        r[REGMAP["pktengine.config"].offset] = 8
        r[REGMAP["flow.config"].offset] = 4 | 4 << 8 | 4 << 12 | 8 << 20 | 2 << 28
        r[REGMAP["mr.config"].offset] = 6 | 8 << 8
        r[REGMAP["qpctx.config"].offset] = 2                    # 4 QPs
        r[REGMAP["hostq.config"].offset] = 2 | 2 << 8 | 4 << 16 | 4 << 24
        r[REGMAP["transport.gid0_mac_lo"].offset] = 0x0000000A
        r[REGMAP["transport.gid0_mac_hi"].offset] = 0x0200
        r[REGMAP["transport.gid0_ip0"].offset] = 0x0A000001
        for name, value in (counters or {}).items():
            r[REGMAP[name].offset] = value
        self.regs = r
        self.contexts = contexts or {}
        self.reads = self.writes = 0

    async def read32(self, offset):
        self.reads += 1
        return self.regs.get(offset, 0)

    async def write32(self, offset, value):
        self.writes += 1
        self.regs[offset] = value
        if offset == REGMAP["qpctx.command"].offset and value == 1:
            index = self.regs[REGMAP["qpctx.index"].offset]
            word = QP_CONTEXT.pack(self.contexts.get(index, {}))
            for i, w in enumerate(QP_CONTEXT.to_words(word)):
                self.regs[REGMAP[f"qpctx.rdata{i}"].offset] = w


class FakeCtx:
    """What qp_table needs of a verbs Context: ``ring_state``."""

    async def ring_state(self, kind, index):
        if kind == "cq":
            return [0x10000, 0, 8 | 1 << 8 | 3 << 16, 5 | 5 << 16, 1]
        return [0x20000, 0, 4 | 1 << 8 | 0 << 16, 7 | 6 << 16, 7 | 6 << 16]


RTS_CTX = {"state": int(QpState.RTS), "remote_qpn": 0x101, "sq_psn": 0x1234, "epsn": 0x55,
           "pmtu": 3, "dst_ip": 0x0A000002, "dst_mac": 0x02000000000B, "msn": 2}


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------------- arguments
def test_parse_sizes():
    assert cli.parse_sizes("64") == [64]
    assert cli.parse_sizes("64,256, 4096") == [64, 256, 4096]
    assert cli.parse_sizes("64,...,1024") == [64, 128, 256, 512, 1024]
    assert cli.parse_sizes("4K,...,64K") == [4096, 8192, 16384, 32768, 65536]
    assert cli.parse_sizes("1M") == [1 << 20]
    for bad in ("", "0", "...,64", "64,...", "1024,...,64", "x"):
        with pytest.raises(ValueError):
            cli.parse_sizes(bad)


def parse(*argv):
    return cli.request_from_args(cli.build_parser().parse_args(list(argv)))


def test_requests_from_arguments():
    assert parse("info") == {"command": "info"}
    assert parse("stats") == {"command": "stats", "all": False}
    assert parse("stats", "--all")["all"] is True
    assert parse("qp", "list") == {"command": "qp", "action": "list", "index": None}
    assert parse("qp", "show", "0x3") == {"command": "qp", "action": "show", "index": 3}
    assert parse("perf", "write-bw") == {"command": "perf", "test": "write_bw", "sizes": [4096],
                                         "iters": 100, "tx_depth": 32, "batch": 1, "signal_every": 8}
    r = parse("perf", "read-bw", "--sizes", "64,...,256", "--iters", "10", "--tx-depth", "8",
              "--batch", "4", "--signal-every", "8")
    assert (r["test"], r["sizes"], r["iters"], r["batch"]) == ("read_bw", [64, 128, 256], 10, 4)
    assert r["signal_every"] == 5, "clipped to tx_depth - batch + 1: a full queue holds a signaled WR"
    lat = parse("perf", "write-lat", "--batch", "8")
    assert (lat["test"], lat["sizes"], lat["batch"]) == ("write_lat", [64], 1)
    # backend options
    args = cli.build_parser().parse_args(["--device", "0000:01:00.0", "--json", "info"])
    assert (args.device, args.json, args.uart) == ("0000:01:00.0", True, None)


@pytest.mark.parametrize("argv", [
    ["perf", "write-bw", "--size", "64", "--sizes", "64,128"],     # exclusive
    ["perf", "write-bw", "--iters", "0"],
    ["perf", "send-bw"],
    ["--device", "0000:01:00.0", "--uart", "/dev/ttyUSB0", "info"],
    ["qp"],
    [],
])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    assert e.value.code == 2


# -------------------------------------------------------------------- collection and tables
def test_info_from_registers():
    dev = FakeRegs(contexts={1: RTS_CTX, 3: {"state": int(QpState.INIT)}})
    info = run(cli.device_info(dev, "nic0"))
    assert info["version"] == "0.1.0" and info["id"] == "0x53544c52"
    assert [f["name"] for f in info["features"]] == list(BLOCKS)
    assert info["tables"]["qps"] == 16 and info["tables"]["mr_entries"] == 64
    assert info["hostq"] == {"qps": 4, "cqs": 4, "sq_depth": 16, "rq_depth": 16}
    assert info["data_width"] == 64
    assert info["gids"] == [{"index": 0, "mac": "02:00:00:00:00:0a", "ip": "10.0.0.1"}]
    assert info["qps"] == {"total": 4, "in_use": [{"index": 1, "qpn": 0x101, "state": "RTS"},
                                                  {"index": 3, "qpn": 0x103, "state": "INIT"}]}
    text = cli.render({"command": "info", "devices": [info]})
    assert "nic0: Stellar 0.1.0" in text
    assert "host queues  4 QPs, 4 CQs, SQ depth 16, RQ depth 16" in text
    assert "GIDs         0: 02:00:00:00:00:0a 10.0.0.1" in text
    assert "QPs in use   2 of 4: 0x101 RTS, 0x103 INIT" in text


def test_info_of_a_board_without_host_queues():
    dev = FakeRegs(blocks=("pktengine", "flow", "qpctx", "mr", "transport", "wq"))
    info = run(cli.device_info(dev, "/dev/ttyUSB0"))
    assert "hostq" not in info
    assert "host queues  none" in cli.render({"command": "info", "devices": [info]})


def test_info_refuses_a_non_stellar_device():
    dev = FakeRegs()
    dev.regs[0] = 0xFFFFFFFF
    with pytest.raises(cli.DeviceError, match="no Stellar register map"):
        run(cli.device_info(dev, "x"))


def test_stats_every_counter_of_every_block():
    a = FakeRegs(counters={"transport.tx_packets": 14, "hostq.sq_wqes": 7, "mr.rx_drop_rkey": 1})
    b = FakeRegs(counters={"transport.rx_requests": 14})
    doc = run(cli.execute({"command": "stats", "all": False}, [("a", a, None), ("b", b, None)]))
    counters = doc["devices"][0]["counters"]
    assert list(counters) == list(BLOCKS)
    expected = {f"{blk}.{r.name}" for blk in BLOCKS for r in REGMAP.block(blk).counters}
    assert {f"{blk}.{n}" for blk, regs in counters.items() for n in regs} == expected
    assert counters["transport"]["tx_packets"] == 14
    text = cli.render(doc)
    lines = text.splitlines()
    assert lines[0].split() == ["counter", "a", "b"]
    assert any(line.split() == ["transport.tx_packets", "14", "0"] for line in lines)
    assert any(line.split() == ["transport.rx_requests", "0", "14"] for line in lines)
    assert not any(line.startswith("pktengine.rx_frames") for line in lines), "zero rows hidden"
    assert f"({len(expected) - 4} counters are zero" in text
    full = cli.format_stats(doc, show_all=True)
    assert len(full.splitlines()) == 1 + len(expected)
    # ethtool -S has no JSON; ours round-trips
    assert json.loads(json.dumps(doc)) == doc


def test_qp_list_and_show():
    dev = FakeRegs(contexts={2: RTS_CTX})
    doc = run(cli.execute({"command": "qp", "action": "list"}, [("a", dev, FakeCtx())]))
    (qp,) = doc["devices"][0]["qps"]
    assert (qp["index"], qp["qpn"], qp["context"]["state"]) == (2, 0x102, "RTS")
    assert qp["context"]["dst_ip"] == "10.0.0.2" and qp["context"]["mtu"] == 1024
    assert qp["rings"]["sq"] == {"addr": "0x20000", "entries": 16, "enabled": True, "cq": 0,
                                 "doorbell": 7, "fetched": 6, "posted": 7, "credits_returned": 6}
    assert qp["rings"]["cq0"]["producer"] == 5 and qp["rings"]["cq0"]["armed"]
    text = cli.render(doc)
    assert "a: 1 of 4 QPs in use" in text
    row = next(line for line in text.splitlines() if "0x102" in line).split()
    assert row[:6] == ["2", "0x102", "RTS", "0x101", "10.0.0.2", "1024"] and row[-1] == "7/6/6"

    doc = run(cli.execute({"command": "qp", "action": "show", "index": 2}, [("a", dev, None)]))
    text = cli.render(doc)
    assert "a: QP 2 (QPN 0x102)" in text
    for field in QP_CONTEXT:
        assert f"  {field.name} " in text
    assert "sq_psn           0x1234" in text and "rings            none" in text
    with pytest.raises(ValueError, match="QPs 0..3"):
        run(cli.qp_table(dev, "a", index=4))


# -------------------------------------------------------------------------- perf, faked pair
class FakeMmio:
    def __init__(self):
        self.reads = self.writes = 0

    def snapshot(self):
        return self.reads, self.writes


class FakeMR:
    def __init__(self, mem, base):
        self.mem, self.addr, self.lkey, self.rkey = mem, base, base >> 20, base >> 20


class FakeNet:
    """The wire and both memories: a WR is executed ``delay`` clock idles after its post (WRITE
    copies local -> remote, READ remote -> local) and its CQE (when signaled, or an error)
    becomes visible to the poller of its CQ."""

    def __init__(self, delay=3, corrupt=False, fail_wr=None):
        self.mrs = {}
        self.delay, self.corrupt, self.fail_wr = delay, corrupt, fail_wr
        self.in_flight = []

    def view(self, addr, n):
        for mr in self.mrs.values():
            if mr.addr <= addr < mr.addr + len(mr.mem):
                off = addr - mr.addr
                return memoryview(mr.mem)[off:off + n]
        raise AssertionError(f"address {addr:#x} in no MR")

    def tick(self):
        for item in self.in_flight:
            item[0] -= 1
        while self.in_flight and self.in_flight[0][0] <= 0:
            _t, wr, qp = self.in_flight.pop(0)
            (sge,) = wr.sg_list
            local = self.view(sge.addr, sge.length)
            remote = self.view(wr.remote_addr, sge.length)
            if wr.opcode == perf.WrOpcode.RDMA_WRITE:
                remote[:] = local
                if self.corrupt and wr.wr_id == 3:
                    remote[0] ^= 0xFF
            else:
                local[:] = remote
            qp.sq_pending.remove(wr)
            status = WcStatus.REM_ACCESS_ERR if wr.wr_id == self.fail_wr else WcStatus.SUCCESS
            if wr.send_flags & perf.SendFlags.SIGNALED or status != WcStatus.SUCCESS:
                qp.cq.ready.append(types.SimpleNamespace(wr_id=wr.wr_id, status=status,
                                                         vendor_err=0))


class FakeQP:
    def __init__(self, net, mmio, cq, depth=64):
        self.net, self.mmio, self.cq, self.depth = net, mmio, cq, depth
        self.sq_log = depth.bit_length() - 1
        self.sq_pending = []

    @property
    def sq_free(self):
        return self.depth - len(self.sq_pending)

    async def post_send(self, wrs):
        wrs = [wrs] if not isinstance(wrs, list) else wrs
        assert len(wrs) <= self.sq_free, "the perf loop overfilled the send queue"
        self.sq_pending += wrs
        self.mmio.writes += 1                                # one doorbell per list
        for wr in wrs:
            self.net.in_flight.append([self.net.delay, wr, self])

    async def destroy(self):
        pass


class FakeCQ:
    def __init__(self):
        self.ready = []

    async def poll(self, n):
        out, self.ready = self.ready[:n], self.ready[n:]
        return out

    async def destroy(self):
        pass


class FakeClock(perf.Clock):
    """1 GHz simulated time that advances only in ``idle`` (and moves the fake wire)."""
    kind, hz, timeout = "simulated", 1e9, 1e-6

    def __init__(self, net):
        self.net, self.t = net, 0.0

    def now(self):
        return self.t

    async def idle(self):
        self.t += 1e-9
        self.net.tick()


def fake_pair(net, region=1 << 14, depth=64):
    eps = []
    for i in range(2):
        mem = mmap.mmap(-1, 2 * region)
        mr = FakeMR(mem, (i + 1) << 24)
        net.mrs[i] = mr
        cq = FakeCQ()
        ctx = types.SimpleNamespace(mmio=FakeMmio())
        qp = FakeQP(net, ctx.mmio, cq, depth)
        eps.append(perf.PerfEndpoint(ctx, None, cq, qp, mr, mem, region))
    pair = perf.PerfPair(*eps)

    async def close():
        pass
    pair.close = close
    return pair


@pytest.mark.parametrize("test", ["write_bw", "read_bw"])
@pytest.mark.parametrize("size,iters,depth,batch,sig", [(64, 64, 16, 4, 8), (1000, 10, 4, 1, 4),
                                                         (4096, 7, 8, 3, 2)])
def test_bw_accounting(test, size, iters, depth, batch, sig):
    net = FakeNet()
    pair = fake_pair(net)
    seen = []
    fn = perf.TESTS[test]
    r = run(fn(pair, size=size, iters=iters, clock=FakeClock(net), tx_depth=depth, batch=batch,
               signal_every=sig, progress=lambda *a: seen.append(a)))
    assert (r.bytes, r.messages, r.verified) == (iters * size, iters, True)
    lists = -(-iters // batch)                  # whole lists, the last one may be short
    assert r.sq_doorbells == r.mmio_writes == lists and r.mmio_reads == 0
    if iters % batch == 0:
        assert r.mmio_writes_per_wr == 1 / batch
    signaled = len({k for k in range(iters) if (k + 1) % sig == 0} | {iters - 1})
    assert r.latency.samples == signaled
    assert r.latency.min <= r.latency.median <= r.latency.p99 <= r.latency.max
    # a WR completes 3 clocks after its post, and is polled at once
    assert r.cycles == round(r.seconds * 1e9) and r.latency.cycles()["min"] == 3
    assert seen[-1] == (test, size, iters, iters)
    assert r.gbps == pytest.approx(iters * size * 8 / r.seconds / 1e9)
    back = perf.PerfResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r


def test_write_lat_ping_pong():
    net = FakeNet(delay=5)
    r = run(perf.write_lat(fake_pair(net), size=32, iters=20, clock=FakeClock(net), tx_depth=8,
                           signal_every=4))
    assert (r.messages, r.bytes, r.verified) == (40, 40 * 32, True)
    assert r.latency.samples == 20
    # each way the WRITE lands 5 clocks after its post, and the poller sees it then
    assert r.latency.cycles() == {"min": 5, "median": 5, "p99": 5, "max": 5, "mean": 5}
    assert r.sq_doorbells == 40 and r.mmio_writes_per_wr == 1.0


def bw(net, **kw):
    return run(perf.write_bw(fake_pair(net, depth=kw.pop("depth", 64)), clock=FakeClock(net),
                             **{"size": 64, "iters": 10, "tx_depth": 8, "signal_every": 4, **kw}))


def test_perf_errors():
    with pytest.raises(perf.DataMismatch, match="1 of 640 destination bytes differ") as e:
        bw(FakeNet(corrupt=True))
    assert e.value.code == "E7101" and e.value.offset == 3 * 64
    with pytest.raises(perf.CompletionError, match="REM_ACCESS_ERR"):
        bw(FakeNet(fail_wr=5))
    with pytest.raises(perf.PerfTimeout, match="0 of 4 WRs completed"):
        bw(FakeNet(delay=10_000), iters=4, tx_depth=4)
    for kw, match in (({"tx_depth": 32}, "tx_depth 32"), ({"batch": 9}, "batch 9"),
                      ({"batch": 4, "signal_every": 6}, "signal_every 6"),
                      ({"size": 1 << 20}, "size")):
        with pytest.raises(ValueError, match=match):
            bw(FakeNet(), depth=16, **kw)


def test_perf_table():
    r = perf.PerfResult(test="write_bw", size=4096, iters=100, tx_depth=32, batch=4, signal_every=8,
                        bytes=409600, messages=100, seconds=409600 * 8 / 10e9, clock="simulated",
                        hz=250e6, latency=perf.LatencyStats.of([1e-6, 2e-6, 3e-6], 250e6),
                        mmio_writes=25, mmio_reads=0, sq_doorbells=25, verified=True)
    assert r.gbps == pytest.approx(10.0) and r.mmio_writes_per_wr == 0.25 and r.cq_doorbells == 0
    assert r.latency.cycles() == {"min": 250, "median": 500, "p99": 750, "max": 750, "mean": 500}
    doc = {"command": "perf", "test": "write_bw", "runs": [{"result": r.to_dict(), "counters": {}}]}
    text = cli.render(doc)
    assert text.startswith("RDMA WRITE bandwidth: 100 iterations, tx depth 32, 4 WR per list, "
                           "1 in 8 signaled (simulated time, 250 MHz clock)")
    row = text.splitlines()[-1].split()
    assert row == ["4096", "100", "409600", "10.000", "0.3052", "1.000/2.000/3.000", "250/500/750",
                   "0.250", "0.000", "yes"]


def test_latency_percentiles():
    s = perf.LatencyStats.of([float(i) for i in range(1, 201)])
    assert (s.min, s.median, s.p99, s.max) == (1, 100.5, 198, 200) and s.cycles() is None
    assert perf.LatencyStats.of([]) is None


# ---------------------------------------------------------------------------- error paths
def test_board_refuses_perf_before_opening_anything(capsys, monkeypatch):
    def no_open(*a, **k):
        raise AssertionError("the port was opened")
    monkeypatch.setattr("stellar.host.uartbus.SerialTransport", no_open)
    assert cli.main(["--uart", "/dev/ttyUSB7", "perf", "write-bw"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stellar: E5020: `stellar perf` on the board at /dev/ttyUSB7")
    assert "no host queues" in err and "Fix: run perf on a PCIe build" in err


def test_board_info_through_the_uart_backend(capsys, monkeypatch):
    """``--uart``: the same collection code on a UART bus (here over a fake register file)."""
    regs = FakeRegs(blocks=("pktengine", "flow", "qpctx", "mr", "transport", "wq"),
                    counters={"pktengine.rx_frames": 9})

    monkeypatch.setattr("stellar.host.uartbus.SerialTransport", lambda port, baud: object())
    monkeypatch.setattr("stellar.host.uartbus.UartBus", lambda transport, baudrate: _Bus(regs))
    assert cli.main(["--uart", "/dev/ttyUSB7", "--json", "stats"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"][0]["name"] == "/dev/ttyUSB7"
    assert doc["devices"][0]["counters"]["pktengine"]["rx_frames"] == 9
    assert cli.main(["--uart", "/dev/ttyUSB7", "info"]) == 0
    assert "host queues  none" in capsys.readouterr().out


class _Bus(Device):
    """A Device over a FakeRegs (registers only, like a board's UART bus)."""

    def __init__(self, regs):
        self.regs = regs

    async def read32(self, offset):
        return await self.regs.read32(offset)

    async def write32(self, offset, value):
        await self.regs.write32(offset, value)

    def alloc_dma(self, size, align=4096):
        raise AssertionError("no DMA here")

    map_dma = unmap_dma = alloc_dma

    async def wait_irq(self, vector, timeout=None):
        raise AssertionError("no interrupts here")

    async def close(self):
        pass


def test_board_port_that_does_not_open(capsys, monkeypatch):
    def refuse(port, baud):
        raise OSError(2, "could not open port /dev/ttyUSB9: No such file or directory")
    monkeypatch.setattr("stellar.host.uartbus.SerialTransport", refuse)
    assert cli.main(["--uart", "/dev/ttyUSB9", "info"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stellar: E5001: cannot open the serial port /dev/ttyUSB9") and "dialout" in err


def test_vfio_device_that_is_not_there(capsys):
    assert cli.main(["--device", "0000:7f:1f.7", "info"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stellar: E5001:") and "0000:7f:1f.7" in err and "Fix:" in err
    assert cli.main(["--device", "0000:7f:1f.7", "perf", "write-bw"]) == 2
    assert "E5001" in capsys.readouterr().err


def test_vfio_session_on_a_fake_device(monkeypatch):
    """``--device <PCI>`` runs execute() on a verbs Context of the device: here a fake register
    file standing in for the VFIO device (Context.open reads the ident and hostq blocks)."""
    regs = FakeRegs(contexts={0: RTS_CTX})
    doc = run(cli._vfio_session({"command": "info"}, _Bus(regs), "0000:01:00.0"))
    assert doc["devices"][0]["name"] == "0000:01:00.0"
    assert doc["devices"][0]["qps"]["in_use"] == [{"index": 0, "qpn": 0x100, "state": "RTS"}]
