"""stellar.host.errors: the typed errors keep the seed's codes, speak (cause and fix), carry
their context, are caught by the built-in classes callers expect, survive pickling, and the
host modules that raised their own errors now raise these (tables, UART bus)."""

import asyncio
import pickle

import pytest
from stellar.host import errors
from stellar.host.errors import (
    BufferNotMappable,
    DeviceNotBound,
    FlowTableFull,
    InvalidLkey,
    InvalidQpTransition,
    IrqTimeout,
    LocalBoundsError,
    MrRegistrationTimeout,
    QpInErrorState,
    QueueFull,
    RemoteAccessError,
    StellarError,
    TableError,
    VfioIoctlError,
)


def test_seed_codes_kept():
    assert MrRegistrationTimeout.code == "E1001"
    assert RemoteAccessError.code == "E2003"
    assert QueueFull.code == "E3008"
    assert errors.ERRORS["E1001"] is MrRegistrationTimeout
    assert errors.ERRORS["E2003"] is RemoteAccessError
    assert errors.ERRORS["E3008"] is QueueFull


def test_codes_unique_and_every_error_speaks():
    """Every concrete error has its own code and says a fix (its own default or the raiser's);
    every driver module that defines errors is imported first, so a code reused in two of them
    (as perf and endpoint once did, both E7001-E7003) fails here."""
    import importlib
    for mod in ("verbs", "endpoint", "perf", "cli", "tables", "uartbus", "vfio", "device", "qos"):
        importlib.import_module(f"stellar.host.{mod}")
    seen = {}
    todo = [StellarError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        assert cls.code not in seen or seen[cls.code] is cls, f"{cls} reuses {cls.code}"
        seen[cls.code] = cls
        assert len(cls.code) == 5 and cls.code[0] == "E" and cls.code[1:].isdigit()
    # the classes a driver raises without a specific fix have a default one
    for cls in (MrRegistrationTimeout, BufferNotMappable, InvalidLkey, LocalBoundsError,
                RemoteAccessError, QueueFull, InvalidQpTransition, QpInErrorState, IrqTimeout,
                FlowTableFull):
        assert cls.default_fix and len(cls.default_fix) > 30, cls


def test_message_cause_fix_and_context():
    e = QueueFull("send queue of QP 0x11 full: 64 of 64 work requests outstanding", qpn=0x11,
                  depth=64)
    text = str(e)
    assert text.startswith("E3008: send queue of QP 0x11 full")
    assert "Fix: poll the completion queue" in text
    assert (e.code, e.qpn, e.depth) == ("E3008", 0x11, 64)
    assert e.cause.endswith("outstanding") and e.fix == QueueFull.default_fix
    custom = RemoteAccessError("rkey 0x1234 belongs to PD 2, the QP is in PD 1",
                               fix="register the region in PD 1", rkey=0x1234)
    assert str(custom) == ("E2003: rkey 0x1234 belongs to PD 2, the QP is in PD 1. Fix: register "
                           "the region in PD 1")


def test_builtin_bases():
    """Callers catching the built-in kinds still catch these."""
    assert isinstance(MrRegistrationTimeout("x"), TimeoutError)
    assert isinstance(IrqTimeout("x"), TimeoutError)
    assert isinstance(BufferNotMappable("x"), ValueError)
    assert isinstance(InvalidQpTransition("x"), ValueError)
    assert isinstance(errors.DevicePermissionError("x"), PermissionError)
    assert isinstance(errors.DeviceNotFound("x"), FileNotFoundError)
    assert isinstance(TableError("x"), RuntimeError)
    e = VfioIoctlError("VFIO_IOMMU_MAP_DMA failed", errno=12, ioctl="VFIO_IOMMU_MAP_DMA")
    assert isinstance(e, OSError) and e.errno == 12      # OSError's errno slot holds it
    for cls in (QueueFull, QpInErrorState, DeviceNotBound, FlowTableFull):
        assert issubclass(cls, StellarError)


def test_pickle_round_trip():
    for e in (QueueFull("full", qpn=3), VfioIoctlError("boom", errno=1, ioctl="X"),
              FlowTableFull("flow table full", tenant=1, qpn=2)):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
        assert back.context == e.context


def test_tables_errors_moved_and_reexported():
    from stellar.host import tables
    assert tables.TableError is TableError and tables.FlowTableFull is FlowTableFull
    assert issubclass(FlowTableFull, TableError)


class _StuckRegs:
    """A device whose every table stays busy (status bit 0 always set)."""

    def __init__(self):
        self.writes = []

    async def read32(self, offset):
        return 1

    async def write32(self, offset, value):
        self.writes.append((offset, value))


def test_tables_mr_timeout_is_e1001_and_flow_timeout_is_table_error():
    from stellar.host.tables import Tables
    t = Tables(_StuckRegs(), poll_limit=5)
    with pytest.raises(MrRegistrationTimeout, match=r"^E1001: mr: command still busy after 5"):
        asyncio.run(t.write_mr(3, tag=1, tenant=0, pd=0, access=0, va=0, length=64))
    with pytest.raises(TableError, match=r"^E6001: flow: command still busy") as info:
        asyncio.run(t.insert_flow(0, 0x11, 2))
    assert info.value.block == "flow" and "Fix:" in str(info.value)


def test_uartbus_errors_in_hierarchy():
    from stellar.host.uartbus import UartBusError, UartBusProtocolError, UartBusResponseError, UartBusTimeout
    for cls in (UartBusError, UartBusTimeout, UartBusProtocolError, UartBusResponseError):
        assert issubclass(cls, errors.DeviceError) and issubclass(cls, RuntimeError)
    e = UartBusResponseError("write32", 0x0004, 2)
    assert (e.op, e.addr, e.status) == ("write32", 4, 2)
    assert str(e).startswith("E5104: UART bridge: write32 at 0x0004 answered SLVERR. Fix: ")
