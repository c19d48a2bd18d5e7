"""stellar.host.endpoint without a device: the peer file and its errors, the out-of-band channels
(TCP between asyncio tasks on localhost, the in-process hub) and the barrier."""

import asyncio
import random
import socket

import pytest
from stellar.hdl.flow.fields import CcMode, PathMtu
from stellar.host.endpoint import (
    EndpointConfig,
    EndpointConfigError,
    LocalHub,
    OobError,
    TcpOob,
    oob_barrier,
)

SEED = random.SystemRandom().randrange(1 << 30)

GOOD = """\
peers:
  a: {mac: "02:00:00:00:00:a1", ip: 10.0.0.1, oob: "127.0.0.1:18515"}
  b:
    mac: "02-00-00-00-00-B2"
    ip: "fd00::2"
    oob: "[::1]:18516"
    qos: {profile: inference, tenant: 2, vlan: 102, weight: 3}
qos: {profile: ai_training, tenant: 1, vlan: 101}
transport: {mtu: 2048, timeout: 3, retry_cnt: 5, rnr_retry: 6, max_send_wr: 32,
            max_outstanding: 8, op_timeout: 0.5}
"""


def test_config_from_file(tmp_path):
    path = tmp_path / "peers.yaml"
    path.write_text(GOOD)
    cfg = EndpointConfig.load(path)
    a, b = cfg.peer("a"), cfg.peer("b")
    assert (a.mac, a.ip, a.oob) == (0x0200000000A1, "10.0.0.1", ("127.0.0.1", 18515))
    assert (b.mac, b.ip, b.oob) == (0x0200000000B2, "fd00::2", ("::1", 18516))
    assert (a.qos.profile, a.qos.tenant, a.qos.vlan, a.qos.rate_control, a.qos.weight) == \
        ("ai_training", 1, 101, CcMode.DCQCN, 1)
    assert (b.qos.profile, b.qos.tenant, b.qos.vlan, b.qos.weight) == ("inference", 2, 102, 3)
    t = cfg.transport
    assert (t.path_mtu, t.timeout, t.retry_cnt, t.rnr_retry, t.max_send_wr, t.outstanding) == \
        (PathMtu.MTU_2048, 3, 5, 6, 32, 8)
    assert t.operation_timeout == 0.5
    assert cfg.source == str(path)


def test_config_defaults_and_dict():
    cfg = EndpointConfig.load({"oob": "local", "peers": {
        "x": {"mac": 0x020000000001, "ip": "192.168.1.1"},
        "y": {"mac": "2:0:0:0:0:2", "ip": "192.168.1.2", "qos": {"rate_control": "flowmatrix"}}}})
    x, y = cfg.peer("x"), cfg.peer("y")
    assert x.oob == y.oob == "local" and y.mac == 0x020000000002
    assert x.qos.profile is None and x.qos.tenant == 0 and x.qos.rate_control == CcMode.NONE
    assert y.qos.rate_control == CcMode.FLOWMATRIX
    t = cfg.transport
    assert (t.mtu, t.timeout, t.retry_cnt, t.rnr_retry, t.outstanding) == (1024, 14, 7, 7, 64)
    # default operation timeout: every retry's ACK timeout, twice, plus a millisecond
    assert t.operation_timeout == pytest.approx(2 * 4.096e-6 * 2 ** 14 * 8 + 1e-3)
    assert EndpointConfig.load(cfg) is cfg


BASE = {"peers": {"a": {"mac": "02:00:00:00:00:01", "ip": "10.0.0.1", "oob": "h:1"},
                  "b": {"mac": "02:00:00:00:00:02", "ip": "10.0.0.2", "oob": "h:2"}}}


def _with(path, value):
    """BASE with ``value`` at the dotted ``path`` (None: the key removed)."""
    import copy
    d = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node.setdefault(p, {})
    if value is None:
        del node[last]
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("path,value,key,words", [
    ("peers", None, "peers", "missing"),
    ("peers", {}, "peers", "no peer"),
    ("peers", [1, 2], "peers", "mapping"),
    ("transport.mtuu", 1024, "transport.mtuu", "unknown key"),
    ("transport.mtu", 1000, "transport.mtu", "1000"),
    ("transport.timeout", 32, "transport.timeout", "0..31"),
    ("transport.retry_cnt", True, "transport.retry_cnt", "integer"),
    ("transport.op_timeout", -1, "transport.op_timeout", "number"),
    ("transport.max_outstanding", 65, "transport.max_outstanding", "max_send_wr"),
    ("peers.a.mac", "02:00:00:00:00", "peers.a.mac", "MAC"),
    ("peers.a.mac", "zz:00:00:00:00:01", "peers.a.mac", "MAC"),
    ("peers.b.ip", "10.0.0.300", "peers.b.ip", "IPv4"),
    ("peers.b.ip", None, "peers.b.ip", "missing"),
    ("peers.b.oob", "nowhere", "peers.b.oob", "host:port"),
    ("peers.b.oob", None, "peers.b.oob", "missing"),
    ("peers.b.oob", "h:1", "peers", "h:1"),
    ("peers.b.colour", "red", "peers.b.colour", "unknown key"),
    ("qos.profile", "gaming", "qos.profile", "ai_training"),
    ("qos.tenant", 3, "qos.tenant", "vlan"),
    ("qos.vlan", 4095, "qos.vlan", "1..4094"),
    ("peers.a.qos", {"rate_control": "cubic"}, "peers.a.qos.rate_control", "dcqcn"),
    ("peers.a.qos", {"weight": 0}, "peers.a.qos.weight", "1..255"),
])
def test_config_errors(path, value, key, words):
    with pytest.raises(EndpointConfigError) as info:
        EndpointConfig.load(_with(path, value))
    e = info.value
    assert e.code == "E7001" and e.key == key and e.source == "<dict>", e
    assert f"<dict>: {key}:" in str(e) and words in str(e), str(e)
    assert isinstance(e, ValueError) and e.fix


def test_config_file_errors(tmp_path):
    # an unquoted MAC of decimal digits is a base-60 integer to YAML: named, with the fix
    path = tmp_path / "p.yaml"
    path.write_text("peers:\n  a: {mac: 12:00:00:00:00:01, ip: 10.0.0.1, oob: local}\n")
    with pytest.raises(EndpointConfigError) as info:
        EndpointConfig.load(path)
    assert str(path) in str(info.value) and "peers.a.mac" in str(info.value)
    assert "quote" in info.value.fix
    path.write_text("peers: {a: [unclosed\n")
    with pytest.raises(EndpointConfigError, match="not valid YAML"):
        EndpointConfig.load(path)
    with pytest.raises(EndpointConfigError, match="cannot read"):
        EndpointConfig.load(tmp_path / "missing.yaml")
    path.write_text(GOOD)
    with pytest.raises(EndpointConfigError, match=r"peers\.c: no such peer .*a, b"):
        EndpointConfig.load(path).peer("c")


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _tcp(names, timeout=5.0):
    addrs = dict(zip(names, (("127.0.0.1", p) for p in _free_ports(len(names))), strict=True))
    return {n: TcpOob(n, addrs[n], {m: a for m, a in addrs.items() if m != n}, timeout=timeout)
            for n in names}


def test_tcp_oob_exchange():
    """Two endpoints as asyncio tasks: the one that dials (``a``) starts late and retries;
    messages of different tags are kept apart and in order; bodies survive JSON."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    bodies = [{"qpn": rng.randrange(1 << 24), "psn": rng.randrange(1 << 24), "k": [i, "x"]}
              for i in range(20)]

    async def main():
        ch = _tcp(["a", "b"])
        await ch["b"].start()

        async def side_a():
            await asyncio.sleep(0.2)            # b is already waiting for a's connection
            await ch["a"].start()
            for i, body in enumerate(bodies):
                await ch["a"].send("b", f"t{i % 3}", body)
            return await ch["a"].recv("b", "reply", timeout=5)

        async def side_b():
            got = {t: [] for t in ("t0", "t1", "t2")}
            for t in ("t2", "t0", "t1"):        # read tags in another order than sent
                for _ in range(sum(1 for i in range(20) if f"t{i % 3}" == t)):
                    got[t].append(await ch["b"].recv("a", t, timeout=5))
            await ch["b"].send("a", "reply", {"n": sum(len(v) for v in got.values())})
            return got

        reply, got = await asyncio.gather(side_a(), side_b())
        for c in ch.values():
            await c.close()
        return reply, got

    reply, got = asyncio.run(main())
    assert reply == {"n": 20}
    for t in range(3):
        assert got[f"t{t}"] == [b for i, b in enumerate(bodies) if i % 3 == t]


def test_tcp_oob_errors():
    async def main():
        ch = _tcp(["a", "b"], timeout=0.3)
        await ch["a"].start()
        # b never starts: a cannot reach it, naming the peer and the address
        with pytest.raises(OobError, match=r"cannot reach peer 'b' at 127\.0\.0\.1:\d+") as e1:
            await ch["a"].send("b", "x", {})
        assert e1.value.code == "E7002"
        # c is not a peer
        with pytest.raises(OobError, match="not a TCP peer"):
            await ch["a"].send("c", "x", {})
        await ch["a"].close()

        ch = _tcp(["a", "b"], timeout=0.3)
        await ch["b"].start()
        # a never connects: b's receive gives up
        with pytest.raises(OobError, match="did not connect"):
            await ch["b"].recv("a", "x")
        await ch["a"].start()
        await ch["a"].send("b", "hello", {"v": 1})
        assert await ch["b"].recv("a", "hello", timeout=1) == {"v": 1}
        with pytest.raises(OobError, match="no 'nothing' message"):
            await ch["b"].recv("a", "nothing", timeout=0.1)
        # a goes away: b's waiting receive is woken with an error, not left hanging
        waiting = asyncio.ensure_future(ch["b"].recv("a", "late", timeout=5))
        await asyncio.sleep(0.05)
        await ch["a"].close()
        with pytest.raises(OobError, match="closed the channel"):
            await waiting
        await ch["b"].close()
        # the same port twice
        ch2 = _tcp(["a", "b"])
        await ch2["a"].start()
        dup = TcpOob("z", ch2["a"].listen, {})
        with pytest.raises(OobError, match="cannot listen"):
            await dup.start()
        await ch2["a"].close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["tcp", "local"])
def test_barrier(kind):
    """Four endpoints, three barrier generations, random delays: nobody leaves a barrier
    before the last one entered it, and a barrier does not mix generations."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    names = ["n0", "n1", "n2", "n3"]
    delays = {(n, g): rng.uniform(0, 0.05) for n in names for g in range(3)}
    log = []

    async def main():
        if kind == "tcp":
            chans = _tcp(names)
            for c in chans.values():
                await c.start()
        else:
            hub = LocalHub(interval=1e-3)
            chans = {n: hub.attach(n) for n in names}

        async def member(n):
            for g in range(3):
                await asyncio.sleep(delays[n, g])
                log.append(("enter", g, n))
                await oob_barrier(chans[n], [m for m in names if m != n], g, timeout=5)
                log.append(("leave", g, n))

        await asyncio.gather(*(member(n) for n in names))
        for c in chans.values():
            await c.close()

    asyncio.run(main())
    for g in range(3):
        last_enter = max(i for i, e in enumerate(log) if e[:2] == ("enter", g))
        first_leave = min(i for i, e in enumerate(log) if e[:2] == ("leave", g))
        assert first_leave > last_enter, (g, log)
    assert len(log) == 2 * 3 * len(names)


def test_barrier_missing_member():
    """A member that never arrives: the others fail with OobError naming it."""
    async def main():
        hub = LocalHub(interval=1e-3)
        a, b = hub.attach("a"), hub.attach("b")
        hub.attach("c")
        with pytest.raises(OobError) as info:
            await asyncio.gather(oob_barrier(a, ["b", "c"], 0, timeout=0.05),
                                 oob_barrier(b, ["a", "c"], 0, timeout=0.05))
        assert info.value.peer == "c" and info.value.code == "E7002"
        with pytest.raises(OobError, match="already attached"):
            hub.attach("a")
        await a.close()
        hub.attach("a")             # free again after close

    asyncio.run(main())
