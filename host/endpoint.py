# Ref: rdma-core librdmacm rdma_cm(7) and ibv_rc_pingpong (what an out-of-band exchange carries:
#      QPN, PSN, GID/MAC; MR address, rkey, length); ibv_modify_qp(3) (RC connect sequence);
#      ibv_req_notify_cq(3) (arm, poll once more, wait)
"""Endpoint: the seed design's few-lines API over the verbs layer (``stellar.host.verbs``)::

    ep = await Endpoint.open(device, "peers.yaml", name="a")      # context, GID 0, PD, QoS
    local = await ep.register_memory(params.numpy())               # zero-copy, remote access
    await ep.connect("b")                                          # CQ + QP, OOB exchange, RTS
    remote = await ep.exchange_memory("b", local)                  # addr / rkey / length
    await ep.rdma_write(remote, local, 4096)                       # waits for the completion
    op = await ep.rdma_write(remote, local, 4096, non_blocking=True, remote_offset=8192)
    wc = await op                                                  # ... later
    await ep.rdma_read(remote, local, 512, local_offset=65536)
    await ep.barrier()                                             # every connected peer
    await ep.close()

The peer file (YAML, or the same structure as a dict)::

    peers:
      a: {mac: "02:00:00:00:00:a1", ip: 10.0.0.1, oob: "127.0.0.1:18515"}
      b: {mac: "02:00:00:00:00:b2", ip: 10.0.0.2, oob: "127.0.0.1:18516",
          qos: {profile: inference, tenant: 2, vlan: 102}}       # per endpoint: overrides
    qos: {profile: ai_training, tenant: 1, vlan: 101}              # default of every endpoint
    transport: {mtu: 1024, timeout: 14, retry_cnt: 7, rnr_retry: 7}
    oob: local                                                     # default of every peer

Quote MACs: YAML reads an unquoted ``12:00:00:00:00:01`` as a base-60 number. Every key is
checked; an error (:class:`EndpointConfigError`, E7001) names the file and the key.

``oob`` is where an endpoint listens for the out-of-band exchange: ``host:port`` (TCP, JSON
lines; of each pair of peers the one whose name sorts first dials) or ``local`` (both endpoints
in one process, one event loop: a :class:`LocalHub`). Under a simulator, whose scheduler is not
asyncio's, pass ``oob=LocalHub(sleep=...)`` with a sleep of the simulator's
(``lambda: Timer(1, "us")`` in cocotb) -- the endpoint itself waits only on the device
(``wait_irq``), never on asyncio.

QoS: an endpoint's ``qos`` places its context in ``tenant`` (frames tagged with ``vlan``, which
both ends of a connection must share; tenant 0 may be untagged), programs the tenant's token
buckets and its traffic class with the profile (``stellar.host.qos.PROFILES``: ``ai_training``
class 7, 40 % guaranteed; ``inference`` class 5, 10 %), and gives every QP the class as its
``sl``, the class's DSCP in its traffic class (ECT(0) for ECN), ``rate_control`` (default DCQCN
with a profile) and ``weight``.

Completions: an operation's completion is found by polling the CQ in host memory; when there is
none yet the endpoint arms the CQ, polls once more and waits for its interrupt, in slices of one
local ACK timeout (4.096 us x 2**timeout), up to ``transport.op_timeout`` seconds (default: the
time the transport needs to give up, retries included). Errors speak (``stellar.host.errors``):
a completion with REM_ACCESS_ERR raises :class:`~stellar.host.errors.RemoteAccessError` (E2003),
more non-blocking operations than ``transport.max_outstanding`` raise
:class:`~stellar.host.errors.QueueFull` (E3008), a memory registration the device does not
finish raises :class:`~stellar.host.errors.MrRegistrationTimeout` (E1001). After an error
completion the connection's QP is in ERROR; ``connect(peer)`` on both ends again resets it
and brings it back to RTS with fresh PSNs.
"""

import abc
import asyncio
import dataclasses
import ipaddress
import itertools
import json
import os
import random
from collections import deque
from dataclasses import dataclass

from stellar.hdl.flow.fields import Access, CcMode, PathMtu, QpState
from stellar.hdl.regmap import REGMAP
from stellar.hdl.transport.formats import WcStatus, WrOpcode

from .errors import (
    IrqTimeout,
    LocalBoundsError,
    QueueFull,
    RemoteAccessError,
    StellarError,
)
from .qos import PROFILES, Qos
from .verbs import (
    SGE,
    AHAttr,
    Context,
    QPAttr,
    QPCap,
    QPInitAttr,
    SendFlags,
    SendWR,
)

__all__ = ["Endpoint", "EndpointConfig", "PeerConfig", "QosConfig", "TransportConfig",
           "LocalMemory", "RemoteMemory", "Operation", "Connection", "OobChannel", "LocalHub",
           "LocalOob", "TcpOob", "oob_barrier", "EndpointConfigError", "OobError",
           "PeerMismatch", "CompletionError", "OperationTimeout", "ALL_ACCESS"]

ALL_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
ECT0 = 0b10                     # ECN field of the traffic class: ECN-capable transport


# ------------------------------------------------------------------------------------ errors
class EndpointConfigError(StellarError, ValueError):
    """The peer file (or dict) has a missing, unknown or invalid key."""
    code = "E7001"
    default_fix = "correct the key named above (the module docstring of stellar.host.endpoint " \
                  "shows the format)"


class OobError(StellarError, ConnectionError):
    """The out-of-band exchange with a peer failed: it did not answer in time, closed the
    channel, or sent something that is not the protocol."""
    code = "E7002"
    default_fix = "start the peer's endpoint (both ends call connect / exchange_memory / " \
                  "barrier, in the same order) and check its oob address in the peer file"


class PeerMismatch(StellarError, ValueError):
    """The two ends of a connection disagree on something both must share."""
    code = "E7003"


class CompletionError(StellarError):
    """An operation completed with an error status other than a remote access error."""
    code = "E7004"
    default_fix = "the connection's QP is now in ERROR: call connect(peer) on both ends to reset " \
                  "it, then post again"


class OperationTimeout(StellarError, TimeoutError):
    """No completion came within the operation timeout."""
    code = "E7005"
    default_fix = "check that the peer's NIC is up and reachable (MAC / IP in the peer file), " \
                  "or raise transport.op_timeout for a slow (simulated) clock"


# ------------------------------------------------------------------------------------ config
_MTUS = {256: PathMtu.MTU_256, 512: PathMtu.MTU_512, 1024: PathMtu.MTU_1024,
         2048: PathMtu.MTU_2048, 4096: PathMtu.MTU_4096}
_CC = {"none": CcMode.NONE, "dcqcn": CcMode.DCQCN, "flowmatrix": CcMode.FLOWMATRIX}


@dataclass(frozen=True)
class QosConfig:
    profile: str | None = None
    tenant: int = 0
    vlan: int | None = None
    rate_control: CcMode = CcMode.NONE
    weight: int = 1
    line_mbps: int | None = None


@dataclass(frozen=True)
class TransportConfig:
    mtu: int = 1024
    timeout: int = 14
    retry_cnt: int = 7
    rnr_retry: int = 7
    min_rnr_timer: int = 1
    max_send_wr: int = 64
    max_outstanding: int | None = None      # None: max_send_wr
    op_timeout: float | None = None         # seconds; None: from timeout and retry_cnt
    oob_timeout: float = 30.0               # seconds

    @property
    def path_mtu(self):
        return _MTUS[self.mtu]

    @property
    def outstanding(self):
        return self.max_send_wr if self.max_outstanding is None else self.max_outstanding

    @property
    def ack_timeout(self):
        """Seconds of one local ACK timeout (None: infinite)."""
        return 4.096e-6 * 2 ** self.timeout if self.timeout else None

    @property
    def operation_timeout(self):
        if self.op_timeout is not None:
            return self.op_timeout
        if self.ack_timeout is None:
            return None
        # every try may time out, RNR waits aside; twice that for the queue ahead of the WR
        return 2 * self.ack_timeout * (self.retry_cnt + 1) + 1e-3


@dataclass(frozen=True)
class PeerConfig:
    name: str
    mac: int
    ip: str
    oob: object                 # "local" or (host, port)
    qos: QosConfig


class _Checker:
    """Validation with errors naming the source and the key."""

    def __init__(self, source, from_file):
        self.source = source
        self.from_file = from_file

    def fail(self, key, why, fix=None):
        raise EndpointConfigError(f"{self.source}: {key}: {why}", fix=fix, key=key,
                                  source=self.source)

    def mapping(self, value, key, allowed=None, required=()):
        if not isinstance(value, dict):
            self.fail(key, f"expected a mapping, found {type(value).__name__} {value!r}")
        for k in value:
            if not isinstance(k, str):
                self.fail(key, f"key {k!r} is not a name")
        if allowed is not None:
            unknown = sorted(set(value) - set(allowed))
            if unknown:
                self.fail(f"{key}.{unknown[0]}" if key else unknown[0], "unknown key",
                          fix=f"one of {', '.join(allowed)}")
        for r in required:
            if r not in value:
                self.fail(f"{key}.{r}" if key else r, "missing")
        return value

    def integer(self, value, key, lo, hi):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(key, f"{value!r} is not an integer in {lo}..{hi}")
        return value

    def number(self, value, key, lo=0.0):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= lo:
            self.fail(key, f"{value!r} is not a number above {lo}")
        return float(value)

    def mac(self, value, key):
        if isinstance(value, int) and not isinstance(value, bool):
            if self.from_file:
                self.fail(key, f"read as the number {value}: YAML takes an unquoted MAC of "
                               "decimal digits (12:00:00:00:00:01) for a base-60 integer",
                          fix='quote the MAC: mac: "02:00:00:00:00:01"')
            if 0 <= value < 1 << 48:
                return value
        if isinstance(value, str):
            parts = value.replace("-", ":").split(":")
            if len(parts) == 6 and all(len(p) in (1, 2) for p in parts):
                try:
                    return int("".join(p.zfill(2) for p in parts), 16)
                except ValueError:
                    pass
        self.fail(key, f"{value!r} is not a MAC address", fix='write six hex bytes, '
                  '"02:00:00:00:00:a1"')

    def ip(self, value, key):
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            self.fail(key, f"{value!r} is not an IPv4 or IPv6 address")

    def oob(self, value, key):
        if value == "local":
            return "local"
        if isinstance(value, str) and ":" in value:
            host, _, port = value.rpartition(":")
            host = host.strip("[]")
            if host and port.isdigit() and 0 < int(port) < 65536:
                return host, int(port)
        self.fail(key, f"{value!r} is neither 'local' nor host:port",
                  fix='oob: "127.0.0.1:18515" (TCP) or oob: local (same process)')

    def qos(self, value, key, base):
        self.mapping(value, key, ("profile", "tenant", "vlan", "rate_control", "weight",
                                  "line_mbps"))
        out = {**dataclasses.asdict(base)}
        if "profile" in value:
            p = value["profile"]
            if p is not None and p not in PROFILES:
                self.fail(f"{key}.profile", f"unknown profile {p!r}", fix=f"one of "
                          f"{', '.join(sorted(PROFILES))}, or leave it out")
            out["profile"] = p
            out["rate_control"] = CcMode.DCQCN if p else CcMode.NONE
        if "tenant" in value:
            out["tenant"] = self.integer(value["tenant"], f"{key}.tenant", 0, 255)
        if "vlan" in value:
            v = value["vlan"]
            out["vlan"] = None if v is None else self.integer(v, f"{key}.vlan", 1, 4094)
        if "rate_control" in value:
            rc = str(value["rate_control"]).lower()
            if rc not in _CC:
                self.fail(f"{key}.rate_control", f"{value['rate_control']!r} is not one of "
                          f"{', '.join(_CC)}")
            out["rate_control"] = _CC[rc]
        if "weight" in value:
            out["weight"] = self.integer(value["weight"], f"{key}.weight", 1, 255)
        if "line_mbps" in value:
            out["line_mbps"] = self.integer(value["line_mbps"], f"{key}.line_mbps", 1, (1 << 20) - 1)
        q = QosConfig(**out)
        if q.tenant and q.vlan is None:
            self.fail(f"{key}.tenant", f"tenant {q.tenant} without a vlan: untagged frames "
                      "belong to tenant 0, so the peer's NIC would not find the QP",
                      fix=f"add {key}.vlan (1..4094, the same on both ends) or use tenant 0")
        return q


@dataclass(frozen=True)
class EndpointConfig:
    """A validated peer file: ``peers`` (name -> :class:`PeerConfig`), ``transport``
    (:class:`TransportConfig`), ``source`` (the file, or ``<dict>``)."""
    peers: dict
    transport: TransportConfig
    source: str = "<dict>"

    @classmethod
    def load(cls, config):
        """From a path (``str`` / ``os.PathLike`` of a YAML file), a dict, or an
        ``EndpointConfig`` (returned as it is)."""
        if isinstance(config, EndpointConfig):
            return config
        if isinstance(config, dict):
            return cls.parse(config, "<dict>", from_file=False)
        if isinstance(config, (str, os.PathLike)):
            import yaml
            path = os.fspath(config)
            try:
                with open(path) as f:
                    data = yaml.safe_load(f)
            except OSError as e:
                raise EndpointConfigError(f"{path}: cannot read the peer file ({e.strerror})",
                                          fix="pass the path of an existing YAML file",
                                          source=path) from None
            except yaml.YAMLError as e:
                raise EndpointConfigError(f"{path}: not valid YAML ({e})", source=path) from None
            return cls.parse(data, path, from_file=True)
        raise EndpointConfigError(f"config of type {type(config).__name__}: expected a path, a "
                                  "dict or an EndpointConfig", source=repr(config))

    @classmethod
    def parse(cls, data, source="<dict>", *, from_file=False):
        c = _Checker(source, from_file)
        c.mapping(data, "", ("peers", "qos", "transport", "oob"), required=("peers",))
        default_qos = c.qos(data["qos"], "qos", QosConfig()) if "qos" in data else QosConfig()
        default_oob = c.oob(data["oob"], "oob") if "oob" in data else None
        t = c.mapping(data.get("transport", {}), "transport",
                      [f.name for f in dataclasses.fields(TransportConfig)])
        tv = {}
        if "mtu" in t:
            if t["mtu"] not in _MTUS:
                c.fail("transport.mtu", f"{t['mtu']!r} is not one of {', '.join(map(str, _MTUS))}")
            tv["mtu"] = t["mtu"]
        for k, lo, hi in (("timeout", 0, 31), ("retry_cnt", 0, 7), ("rnr_retry", 0, 7),
                          ("min_rnr_timer", 0, 31), ("max_send_wr", 1, 1 << 15),
                          ("max_outstanding", 1, 1 << 15)):
            if k in t:
                tv[k] = c.integer(t[k], f"transport.{k}", lo, hi)
        for k in ("op_timeout", "oob_timeout"):
            if k in t:
                tv[k] = c.number(t[k], f"transport.{k}")
        transport = TransportConfig(**tv)
        if transport.outstanding > transport.max_send_wr:
            c.fail("transport.max_outstanding", f"{transport.outstanding} operations cannot be "
                   f"outstanding on a send queue of {transport.max_send_wr}",
                   fix="keep max_outstanding <= max_send_wr")
        peers_in = c.mapping(data["peers"], "peers")
        if not peers_in:
            c.fail("peers", "no peer listed")
        peers = {}
        for name, p in peers_in.items():
            key = f"peers.{name}"
            c.mapping(p, key, ("mac", "ip", "oob", "qos"), required=("mac", "ip"))
            if "oob" in p:
                oob = c.oob(p["oob"], f"{key}.oob")
            elif default_oob is not None:
                oob = default_oob
            else:
                c.fail(f"{key}.oob", "missing (and no top-level oob)",
                       fix='give the peer oob: "host:port", or oob: local at the top level')
            qos = c.qos(p["qos"], f"{key}.qos", default_qos) if "qos" in p else default_qos
            peers[name] = PeerConfig(name, c.mac(p["mac"], f"{key}.mac"),
                                     c.ip(p["ip"], f"{key}.ip"), oob, qos)
        tcp = [p.oob for p in peers.values() if p.oob != "local"]
        if len(set(tcp)) != len(tcp):
            dup = next(a for a in tcp if tcp.count(a) > 1)
            c.fail("peers", f"two peers listen on {dup[0]}:{dup[1]}", fix="give each its own port")
        return cls(peers, transport, source)

    def peer(self, name):
        if name not in self.peers:
            raise EndpointConfigError(f"{self.source}: peers.{name}: no such peer (the file lists "
                                      f"{', '.join(sorted(self.peers))})", key=f"peers.{name}",
                                      source=self.source)
        return self.peers[name]


# -------------------------------------------------------------------------------- OOB channels
class OobChannel(abc.ABC):
    """Messages to and from named peers: ``send(peer, tag, body)`` (a JSON-able dict) and
    ``recv(peer, tag, timeout)`` (the oldest message of that tag from that peer). The interface
    of :class:`LocalOob` and :class:`TcpOob`."""

    name = None

    @abc.abstractmethod
    async def send(self, peer, tag, body):
        """Queue ``body`` for ``peer`` under ``tag``."""

    @abc.abstractmethod
    async def recv(self, peer, tag, timeout=None):
        """The oldest ``tag`` message from ``peer`` (waits at most ``timeout`` seconds)."""

    async def close(self):  # noqa: B027 -- optional: a channel without resources keeps it
        """Release the channel's resources (none by default)."""


class LocalHub:
    """Endpoints of one process (one event loop) exchange their messages here. ``sleep``: a
    callable returning an awaitable that waits about ``interval`` seconds (default
    ``asyncio.sleep``; under cocotb ``lambda: Timer(1, "us")`` with ``interval=1e-6``)."""

    def __init__(self, sleep=None, interval=1e-3):
        self.interval = interval
        self.sleep = sleep or (lambda: asyncio.sleep(interval))
        self.mail = {}          # (to, from, tag) -> deque of JSON texts
        self.attached = {}

    def attach(self, name):
        if name in self.attached:
            raise OobError(f"endpoint {name!r} is already attached to this local hub",
                           fix="close the other endpoint of that name first")
        ch = LocalOob(self, name)
        self.attached[name] = ch
        return ch


class LocalOob(OobChannel):
    """An endpoint's mailbox on a :class:`LocalHub`. Messages go through JSON as on TCP, so
    nothing but data is shared."""

    def __init__(self, hub, name):
        self.hub = hub
        self.name = name

    async def send(self, peer, tag, body):
        self.hub.mail.setdefault((peer, self.name, tag), deque()).append(json.dumps(body))

    async def recv(self, peer, tag, timeout=None):
        box = self.hub.mail.setdefault((self.name, peer, tag), deque())
        waited = 0.0
        while not box:
            if timeout is not None and waited >= timeout:
                raise OobError(f"{self.name}: no {tag!r} message from {peer!r} within {timeout:g} s "
                               "(local hub)", peer=peer, tag=tag)
            await self.hub.sleep()
            waited += self.hub.interval
        return json.loads(box.popleft())

    async def close(self):
        if self.hub.attached.get(self.name) is self:
            del self.hub.attached[self.name]


class TcpOob(OobChannel):
    """JSON lines over TCP (asyncio streams). The endpoint listens on its own address; of two
    peers the one whose name sorts first dials the other (retrying until ``timeout``) and
    introduces itself with ``{"hello": name}``. Use :meth:`start` (or ``Endpoint.open``)."""

    def __init__(self, name, listen, peers, *, timeout=30.0):
        self.name = name
        self.listen = listen            # (host, port)
        self.peers = dict(peers)        # name -> (host, port)
        self.timeout = timeout
        self.server = None
        self.writers = {}
        self.queues = {}                # (peer, tag) -> asyncio.Queue
        self.linked = {}                # peer -> asyncio.Event
        self.tasks = set()
        self.dialing = {}
        self.closed_peers = set()

    async def start(self):
        host, port = self.listen
        try:
            self.server = await asyncio.start_server(self._accept, host, port)
        except OSError as e:
            raise OobError(f"{self.name}: cannot listen on {host}:{port} ({e.strerror})",
                           fix="choose a free port for this endpoint's oob in the peer file") from None
        return self

    def _queue(self, peer, tag):
        return self.queues.setdefault((peer, tag), asyncio.Queue())

    def _event(self, peer):
        return self.linked.setdefault(peer, asyncio.Event())

    async def _accept(self, reader, writer):
        try:
            line = await asyncio.wait_for(reader.readline(), self.timeout)
            peer = json.loads(line)["hello"]
        except (asyncio.TimeoutError, ValueError, KeyError, TypeError):
            writer.close()
            return
        if peer not in self.peers or peer in self.writers:
            writer.close()
            return
        self._attach(peer, reader, writer)

    def _attach(self, peer, reader, writer):
        self.writers[peer] = writer
        task = asyncio.ensure_future(self._read(peer, reader))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self._event(peer).set()

    async def _read(self, peer, reader):
        while True:
            line = await reader.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
                tag, body = msg["tag"], msg["body"]
            except (ValueError, KeyError, TypeError):
                break
            self._queue(peer, tag).put_nowait(body)
        self.closed_peers.add(peer)
        for (p, _tag), q in self.queues.items():
            if p == peer:
                q.put_nowait(None)      # wakes receivers: the peer is gone

    async def _link(self, peer):
        if peer in self.writers:
            return
        if peer not in self.peers:
            raise OobError(f"{self.name}: {peer!r} is not a TCP peer of the peer file",
                           fix="use a peer name listed under peers with a host:port oob")
        if self.name < peer:
            if peer not in self.dialing:
                self.dialing[peer] = asyncio.ensure_future(self._dial(peer))
            await self.dialing[peer]
        else:
            try:
                await asyncio.wait_for(self._event(peer).wait(), self.timeout)
            except asyncio.TimeoutError:
                raise OobError(f"{self.name}: peer {peer!r} did not connect to "
                               f"{self.listen[0]}:{self.listen[1]} within {self.timeout:g} s",
                               peer=peer) from None

    async def _dial(self, peer):
        host, port = self.peers[peer]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, port)
                break
            except OSError as e:
                if loop.time() >= deadline:
                    raise OobError(f"{self.name}: cannot reach peer {peer!r} at {host}:{port} "
                                   f"within {self.timeout:g} s ({e.strerror or e})",
                                   peer=peer) from None
                await asyncio.sleep(0.05)
        writer.write((json.dumps({"hello": self.name}) + "\n").encode())
        await writer.drain()
        self._attach(peer, reader, writer)

    async def send(self, peer, tag, body):
        await self._link(peer)
        if peer in self.closed_peers:
            raise OobError(f"{self.name}: peer {peer!r} closed the channel", peer=peer)
        w = self.writers[peer]
        w.write((json.dumps({"tag": tag, "body": body}) + "\n").encode())
        await w.drain()

    async def recv(self, peer, tag, timeout=None):
        await self._link(peer)
        q = self._queue(peer, tag)
        if q.empty() and peer in self.closed_peers:
            raise OobError(f"{self.name}: peer {peer!r} closed the channel before {tag!r}",
                           peer=peer, tag=tag)
        try:
            body = await asyncio.wait_for(q.get(), timeout)
        except asyncio.TimeoutError:
            raise OobError(f"{self.name}: no {tag!r} message from {peer!r} within {timeout:g} s",
                           peer=peer, tag=tag) from None
        if body is None:
            raise OobError(f"{self.name}: peer {peer!r} closed the channel before {tag!r}",
                           peer=peer, tag=tag)
        return body

    async def close(self):
        for w in self.writers.values():
            w.close()
        for task in list(self.tasks) + list(self.dialing.values()):
            task.cancel()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        self.writers.clear()


async def oob_barrier(oob, peers, generation, timeout=None):
    """Nobody returns before every one of ``peers`` (and this endpoint) has entered barrier
    ``generation``: tell everyone, then hear from everyone."""
    tag = f"barrier:{generation}"
    for p in peers:
        await oob.send(p, tag, {"from": oob.name})
    for p in peers:
        body = await oob.recv(p, tag, timeout)
        if body.get("from") != p:
            raise OobError(f"{oob.name}: barrier {generation}: message on {p!r}'s channel came "
                           f"from {body.get('from')!r}", peer=p)


# ---------------------------------------------------------------------------------- objects
@dataclass(frozen=True)
class RemoteMemory:
    """A peer's region as it advertised it: ``peer``, ``addr``, ``rkey``, ``length``."""
    peer: str
    addr: int
    rkey: int
    length: int


class LocalMemory:
    """A region registered by :meth:`Endpoint.register_memory`: ``mr`` (the verbs MR), ``addr``,
    ``length``, ``lkey``, ``rkey``, ``access``, ``buf`` (the object given)."""

    def __init__(self, mr, buf):
        self.mr = mr
        self.buf = buf
        self.addr, self.length = mr.addr, mr.length
        self.lkey, self.rkey, self.access = mr.lkey, mr.rkey, mr.access

    def __repr__(self):
        return f"LocalMemory(addr={self.addr:#x}, length={self.length}, rkey={self.rkey:#x})"


class Operation:
    """A posted RDMA operation; ``await op`` returns its work completion or raises its error."""

    def __init__(self, ep, conn, wr_id, what, remote):
        self.ep, self.conn, self.wr_id, self.what, self.remote = ep, conn, wr_id, what, remote
        self.wc = None
        self.error = None
        self.finished = False
        self.observed = False

    def done(self):
        return self.finished

    def result(self):
        self.observed = True
        if self.error is not None:
            raise self.error
        return self.wc

    def __await__(self):
        return self.ep._wait(self).__await__()

    def __repr__(self):
        state = ("pending" if not self.finished else "failed" if self.wc is None
                 else self.wc.status.name)
        return f"Operation({self.what}, wr_id={self.wr_id}, {state})"


@dataclass
class Connection:
    """One RC connection to ``peer``: ``qp``, ``cq``, the PSNs and the remote QPN."""
    peer: str
    qp: object
    cq: object
    epoch: int = 0
    sq_psn: int = 0
    rq_psn: int = 0
    remote_qpn: int = 0
    mtu: int = 1024
    pending: dict = dataclasses.field(default_factory=dict)     # wr_id -> Operation
    exchanges: int = 0


# --------------------------------------------------------------------------------- endpoint
class Endpoint:
    """See the module docstring. Open with :meth:`open`."""

    def __init__(self, ctx, config, name, oob, *, owns_ctx, seed=None):
        self.ctx = ctx
        self.config = config
        self.name = name
        self.me = config.peer(name)
        self.oob = oob
        self.pd = ctx.alloc_pd()
        self.qos = None
        self.sl = 0
        self.traffic_class = ECT0
        self.conns = {}
        self.memory = []
        self._owns_ctx = owns_ctx
        self._wr_ids = itertools.count(1)
        self._barriers = 0
        self._rng = random.Random(seed)        # initial PSNs

    @classmethod
    async def open(cls, device, config, name, *, oob=None, seed=None):
        """``device``: a :class:`~stellar.host.device.Device` (a context is opened in the
        endpoint's tenant) or an open :class:`~stellar.host.verbs.Context` (of that tenant).
        ``config``: path, dict or :class:`EndpointConfig`. ``oob``: None (from the config),
        a :class:`LocalHub`, or an :class:`OobChannel`. ``seed``: of the initial PSNs (None:
        fresh ones every run; a number makes a simulation repeatable)."""
        cfg = EndpointConfig.load(config)
        me = cfg.peer(name)
        q = me.qos
        if isinstance(device, Context):
            ctx, owns = device, False
            if (ctx.tenant, ctx.vlan) != (q.tenant, q.vlan):
                raise EndpointConfigError(f"{cfg.source}: peers.{name}.qos: tenant {q.tenant} / "
                                          f"vlan {q.vlan}, but the context given is in tenant "
                                          f"{ctx.tenant} / vlan {ctx.vlan}",
                                          fix="pass the device instead (the endpoint opens the "
                                              "context), or open it with the file's tenant/vlan")
        else:
            ctx, owns = await Context.open(device, tenant=q.tenant, vlan=q.vlan), True
        if oob is None:
            oob = await cls._oob_from_config(cfg, me)
        elif isinstance(oob, LocalHub):
            oob = oob.attach(name)
        ep = cls(ctx, cfg, name, oob, owns_ctx=owns, seed=seed)
        await ctx.set_gid(0, mac=me.mac, ip=me.ip)
        await ep._apply_qos()
        return ep

    @staticmethod
    async def _oob_from_config(cfg, me):
        if me.oob == "local":
            raise EndpointConfigError(f"{cfg.source}: peers.{me.name}.oob: local needs the hub "
                                      "both endpoints share", fix="pass oob=LocalHub() (the same "
                                      "one to every endpoint of the process) to Endpoint.open")
        peers = {n: p.oob for n, p in cfg.peers.items() if n != me.name and p.oob != "local"}
        return await TcpOob(me.name, me.oob, peers, timeout=cfg.transport.oob_timeout).start()

    async def _apply_qos(self):
        q = self.me.qos
        if q.profile is None:
            return
        mmio = self.ctx.mmio
        width = (await mmio.read32(REGMAP["pktengine.config"].offset) & 0xFFFF) * 8
        qos = Qos(mmio, data_width=width)
        if q.line_mbps is not None:
            line = q.line_mbps
        else:
            line = (await mmio.read32(REGMAP["cc.max_rate"].offset)
                    or width * await mmio.read32(REGMAP["cc.us_cycles"].offset))
        tenants = 1 << ((await mmio.read32(REGMAP["cc.config"].offset) >> 8) & 0xFF)
        if q.tenant >= tenants:
            raise EndpointConfigError(f"{self.config.source}: peers.{self.name}.qos.tenant: "
                                      f"{q.tenant}, the device has {tenants} tenants",
                                      fix=f"use a tenant below {tenants}")
        qos.line_mbps = line
        self.sl = await qos.apply_profile(q.tenant, q.profile, line_mbps=line)
        prof = PROFILES[q.profile]
        dscp = 8 * prof.priority if prof.dscp is None else prof.dscp
        self.traffic_class = dscp << 2 | ECT0
        self.qos = qos

    # -- memory ------------------------------------------------------------------------------
    async def register_memory(self, buf, access=ALL_ACCESS):
        """Register ``buf`` (numpy array, bytearray, mmap; zero-copy) for RDMA; returns a
        :class:`LocalMemory`. Default access: local write, remote write and read."""
        mr = await self.pd.reg_mr(buf, Access(access))
        mem = LocalMemory(mr, buf)
        self.memory.append(mem)
        return mem

    async def deregister_memory(self, mem):
        await mem.mr.dereg()
        if mem in self.memory:
            self.memory.remove(mem)

    async def exchange_memory(self, peer, local):
        """Advertise ``local`` to ``peer`` and receive the region it advertises in its call
        (the n-th exchange with a peer pairs with the peer's n-th); returns it as
        :class:`RemoteMemory`."""
        conn = self._conn(peer)
        tag = f"mr:{conn.exchanges}"
        conn.exchanges += 1
        await self.oob.send(peer, tag, {"addr": local.addr, "rkey": local.rkey,
                                        "length": local.length})
        body = await self.oob.recv(peer, tag, self.config.transport.oob_timeout)
        try:
            return RemoteMemory(peer, int(body["addr"]), int(body["rkey"]), int(body["length"]))
        except (KeyError, TypeError, ValueError):
            raise OobError(f"{self.name}: memory exchange with {peer!r}: malformed {body!r}",
                           peer=peer) from None

    # -- connections -------------------------------------------------------------------------
    def _conn(self, peer):
        conn = self.conns.get(peer)
        if conn is None:
            raise PeerMismatch(f"{self.name}: not connected to {peer!r}",
                               fix=f"await ep.connect({peer!r}) first (on both ends)", peer=peer)
        return conn

    def connection(self, peer):
        """The :class:`Connection` to ``peer`` (its ``qp``, ``cq``, PSNs)."""
        return self._conn(peer)

    async def connect(self, peer):
        """An RC connection to ``peer`` (which calls ``connect(<this name>)`` at the same time):
        CQ and QP, QPN / PSN / address exchanged out of band, RESET -> INIT -> RTR -> RTS with
        the file's transport values and this endpoint's QoS. Again on a connected peer (after an
        error): the QP is reset and connected anew."""
        pc = self.config.peer(peer)
        if peer == self.name:
            raise EndpointConfigError(f"{self.name}: cannot connect to itself", peer=peer)
        t = self.config.transport
        conn = self.conns.get(peer)
        if conn is None:
            cq = await self.ctx.create_cq(max(2 * t.max_send_wr, 16))
            qp = await self.ctx.create_qp(self.pd, QPInitAttr(
                send_cq=cq, recv_cq=cq, cap=QPCap(t.max_send_wr, 1)))
            conn = Connection(peer, qp, cq)
            self.conns[peer] = conn
        else:
            await self._fail_pending(conn, "the connection was reset")
            await conn.qp.modify(QPAttr(qp_state=QpState.RESET))
            conn.epoch += 1
        q = self.me.qos
        await conn.qp.modify(QPAttr(qp_state=QpState.INIT, pkey_index=0, port_num=1,
                                    qp_access_flags=ALL_ACCESS, rate_control=q.rate_control,
                                    weight=q.weight))
        conn.sq_psn = self._rng.randrange(1 << 24)
        mine = {"qpn": conn.qp.qp_num, "psn": conn.sq_psn, "mac": self.me.mac, "ip": self.me.ip,
                "vlan": q.vlan, "mtu": t.mtu, "name": self.name, "epoch": conn.epoch}
        tag = f"conn:{conn.epoch}"
        await self.oob.send(peer, tag, mine)
        theirs = await self.oob.recv(peer, tag, t.oob_timeout)
        self._check_peer(pc, theirs)
        conn.rq_psn, conn.remote_qpn = theirs["psn"], theirs["qpn"]
        conn.mtu = min(t.mtu, theirs["mtu"])
        await conn.qp.modify(QPAttr(
            qp_state=QpState.RTR, path_mtu=_MTUS[conn.mtu], dest_qp_num=conn.remote_qpn,
            rq_psn=conn.rq_psn, max_dest_rd_atomic=4, min_rnr_timer=t.min_rnr_timer,
            ah_attr=AHAttr(dgid=pc.ip, dmac=pc.mac, sl=self.sl,
                           traffic_class=self.traffic_class)))
        await conn.qp.modify(QPAttr(qp_state=QpState.RTS, sq_psn=conn.sq_psn, timeout=t.timeout,
                                    retry_cnt=t.retry_cnt, rnr_retry=t.rnr_retry, max_rd_atomic=4))
        # neither end sends before the other is past RTR
        await self.oob.send(peer, f"rts:{conn.epoch}", {"qpn": conn.qp.qp_num})
        await self.oob.recv(peer, f"rts:{conn.epoch}", t.oob_timeout)
        return conn

    def _check_peer(self, pc, theirs):
        try:
            qpn, psn, mac, ip = theirs["qpn"], theirs["psn"], theirs["mac"], theirs["ip"]
            epoch, mtu, vlan = theirs["epoch"], theirs["mtu"], theirs["vlan"]
        except (KeyError, TypeError):
            raise OobError(f"{self.name}: malformed connect message from {pc.name!r}: {theirs!r}",
                           peer=pc.name) from None
        if not (isinstance(qpn, int) and isinstance(psn, int) and 0 <= psn < 1 << 24
                and mtu in _MTUS):
            raise OobError(f"{self.name}: connect message from {pc.name!r} out of range: "
                           f"{theirs!r}", peer=pc.name)
        if (mac, ip) != (pc.mac, pc.ip):
            raise PeerMismatch(f"{self.name}: {pc.name!r} says it is {ip} / {mac:#014x}, the peer "
                               f"file ({self.config.source}) says {pc.ip} / {pc.mac:#014x}",
                               fix="both ends must use the same peer file", peer=pc.name)
        if vlan != self.me.qos.vlan:
            raise PeerMismatch(f"{self.name}: {pc.name!r} sends on vlan {vlan}, this endpoint on "
                               f"vlan {self.me.qos.vlan}: the NICs would drop each other's frames",
                               fix="give both peers the same qos.vlan in the peer file",
                               peer=pc.name)
        if epoch != self.conns[pc.name].epoch:
            raise PeerMismatch(f"{self.name}: {pc.name!r} is at connection {epoch}, this end at "
                               f"{self.conns[pc.name].epoch}",
                               fix="call connect(peer) the same number of times on both ends",
                               peer=pc.name)

    # -- operations --------------------------------------------------------------------------
    async def rdma_write(self, remote, local, length, *, non_blocking=False, remote_offset=0,
                         local_offset=0):
        """Write ``length`` bytes of ``local`` (from ``local_offset``) into ``remote`` (at
        ``remote_offset``). Blocking: returns the work completion once the peer acknowledged;
        ``non_blocking``: returns an :class:`Operation` to await later."""
        return await self._post(WrOpcode.RDMA_WRITE, remote, local, length, non_blocking,
                                remote_offset, local_offset)

    async def rdma_read(self, remote, local, length, *, non_blocking=False, remote_offset=0,
                        local_offset=0):
        """Read ``length`` bytes of ``remote`` into ``local``; as :meth:`rdma_write`."""
        return await self._post(WrOpcode.RDMA_READ, remote, local, length, non_blocking,
                                remote_offset, local_offset)

    async def _post(self, opcode, remote, local, length, non_blocking, roff, loff):
        conn = self._conn(remote.peer)
        what = (f"WRITE of {length} bytes to {remote.peer!r}" if opcode == WrOpcode.RDMA_WRITE
                else f"READ of {length} bytes from {remote.peer!r}")
        if length < 0 or loff < 0 or loff + length > local.length:
            raise LocalBoundsError(f"{what}: local [{loff}, +{length}) is outside the "
                                   f"{local.length}-byte region", addr=local.addr + loff,
                                   length=length)
        if roff < 0 or roff + length > remote.length:
            raise RemoteAccessError(f"{what}: remote [{roff}, +{length}) is outside the "
                                    f"{remote.length}-byte region {remote.peer!r} advertised",
                                    fix="keep remote_offset + length within the remote region",
                                    peer=remote.peer, rkey=remote.rkey)
        limit = self.config.transport.outstanding
        while len(conn.pending) >= limit or conn.qp.sq_free == 0:
            if non_blocking:
                raise QueueFull(f"{self.name}: {len(conn.pending)} operations outstanding to "
                                f"{remote.peer!r} (at most {limit})",
                                fix="await the operations' handles (or ep.barrier()) before "
                                    "posting more, or raise transport.max_outstanding / "
                                    "max_send_wr in the peer file",
                                peer=remote.peer, outstanding=len(conn.pending))
            await self._wait(next(iter(conn.pending.values())), raise_error=False)
        wr_id = next(self._wr_ids)
        op = Operation(self, conn, wr_id, what, remote)
        await conn.qp.post_send(SendWR(
            wr_id=wr_id, opcode=opcode, sg_list=[SGE(local.addr + loff, length, local.lkey)],
            remote_addr=remote.addr + roff, rkey=remote.rkey, send_flags=SendFlags.SIGNALED))
        conn.pending[wr_id] = op
        if non_blocking:
            return op
        return await self._wait(op)

    def _dispatch(self, conn, wcs):
        for wc in wcs:
            op = conn.pending.pop(wc.wr_id, None)
            if op is None:
                continue
            op.wc, op.finished = wc, True
            if wc.status == WcStatus.REM_ACCESS_ERR:
                op.error = RemoteAccessError(
                    f"{self.name}: {op.what} refused by the peer (REM_ACCESS_ERR): rkey "
                    f"{op.remote.rkey:#x} at {op.remote.addr:#x} is unknown or stale there, of "
                    f"another protection domain or tenant, or lacks the access right",
                    peer=op.remote.peer, rkey=op.remote.rkey, wc=wc)
            elif wc.status != WcStatus.SUCCESS:
                op.error = CompletionError(f"{self.name}: {op.what} completed with "
                                           f"{wc.status.name}", peer=op.remote.peer, wc=wc)

    async def _progress(self, conn):
        self._dispatch(conn, await conn.cq.poll(64))

    async def _wait(self, op, raise_error=True):
        conn = op.conn
        t = self.config.transport
        slice_s = t.ack_timeout or 1e-3
        budget = t.operation_timeout
        waited = 0.0
        while not op.done():
            await self._progress(conn)
            if op.done():
                break
            await conn.cq.req_notify()
            await self._progress(conn)      # what came between the poll and the arming
            if op.done():
                break
            if budget is not None and waited >= budget:
                raise OperationTimeout(f"{self.name}: {op.what}: no completion after "
                                       f"{waited:g} s", peer=op.remote.peer, wr_id=op.wr_id)
            try:
                await self.ctx.device.wait_irq(conn.cq.vector, timeout=slice_s)
            except IrqTimeout:
                waited += slice_s
        if raise_error:
            return op.result()
        return op.wc

    async def _fail_pending(self, conn, why):
        await self._progress(conn)
        for op in list(conn.pending.values()):
            op.error = CompletionError(f"{self.name}: {op.what}: {why} before it completed",
                                       peer=op.remote.peer)
            op.finished = True
        conn.pending.clear()

    async def wait_all(self):
        """Wait for every outstanding operation; raises the first error of an operation whose
        handle nobody awaited (its error would otherwise go unseen)."""
        ops = []
        for conn in self.conns.values():
            while conn.pending:
                op = next(iter(conn.pending.values()))
                await self._wait(op, raise_error=False)
                ops.append(op)
        for op in ops:
            if op.error is not None and not op.observed:
                op.result()

    async def barrier(self, peers=None):
        """Wait for this endpoint's outstanding operations, then until every connected peer
        (or ``peers``) entered the same barrier."""
        await self.wait_all()
        peers = sorted(self.conns) if peers is None else list(peers)
        gen = self._barriers
        self._barriers += 1
        await oob_barrier(self.oob, peers, gen, self.config.transport.oob_timeout)

    async def close(self):
        """Destroy the QPs, CQs and memory registrations of this endpoint, close the
        out-of-band channel (and the context, if the endpoint opened it)."""
        for conn in self.conns.values():
            await conn.qp.destroy()
            await conn.cq.destroy()
        self.conns.clear()
        for mem in list(self.memory):
            await self.deregister_memory(mem)
        await self.oob.close()
        if self._owns_ctx:
            await self.ctx.close()

    def __repr__(self):
        return f"Endpoint({self.name!r}, peers connected: {sorted(self.conns)})"

