"""Typed errors of the host driver: every one names the cause and the fix.

Errors speak (DESIGN.md): the driver never raises a bare status code or a generic
``RuntimeError``. Each class below carries a stable ``code`` (``"E1001"``), and each instance
a ``cause`` (what happened, with the numbers that matter) and a ``fix`` (what to do about it;
a class-wide default when the raiser gives none)::

    try:
        ...
    except StellarError as e:
        print(e.code, e.cause, e.fix)

``str(e)`` is ``"E3008: <cause>. Fix: <fix>"``. Keyword arguments given to the constructor
beyond ``fix`` are kept as attributes (``QueueFull(..., qpn=0x11, depth=64).qpn``), so a
program can react without parsing text.

Code ranges (the seed design's three codes are kept as they were):

=========  =====================================================================
E1xxx      memory registration and DMA buffers (E1001 registration timeout)
E2xxx      keys and protection (E2003 remote key / protection domain mismatch)
E3xxx      queues (E3008 queue credits exhausted: the queue is full)
E4xxx      queue-pair state
E5xxx      devices and backends (VFIO, the UART bridge, closed devices, interrupts)
E6xxx      device tables (flow table, QP contexts, memory-region table)
=========  =====================================================================

Several classes also derive from the built-in exception a caller would naturally catch
(``TimeoutError``, ``PermissionError``, ``ValueError``, ``RuntimeError``) so that code written
against those keeps working.
"""

__all__ = [
    "StellarError",
    # E1xxx memory
    "MemoryError_", "MrRegistrationTimeout", "BufferNotMappable", "DmaMappingError",
    "DeviceMemoryOnly",
    # E2xxx keys and protection
    "ProtectionError", "InvalidLkey", "LocalBoundsError", "RemoteAccessError",
    # E3xxx queues
    "QueueError", "QueueFull",
    # E4xxx QP state
    "QpStateError", "InvalidQpTransition", "QpInErrorState",
    # E5xxx devices
    "DeviceError", "DeviceNotFound", "DeviceNotBound", "IommuGroupNotViable",
    "DevicePermissionError", "VfioUnavailable", "VfioIoctlError", "IrqTimeout",
    "IrqUnavailable", "DeviceClosed",
    # E6xxx tables
    "TableError", "FlowTableFull",
    "ERRORS", "errors_by_code",
]


class StellarError(Exception):
    """Base of every error the host driver raises.

    Parameters
    ----------
    cause : str
        What happened, specific (the QP number, the key, the address, the errno).
    fix : str, optional
        What to do; the class's ``default_fix`` when omitted.
    **context
        Stored as attributes for programs that react to the error.
    """

    code = "E0000"
    default_fix = None

    def __init__(self, cause, *, fix=None, **context):
        self.cause = str(cause).rstrip(". ")
        self.fix = fix if fix is not None else self.default_fix
        self.context = context
        super().__init__(self._format())
        # after the base __init__: OSError's would reset errno / filename set before it
        for name, value in context.items():
            setattr(self, name, value)

    def _format(self):
        text = f"{self.code}: {self.cause}"
        if self.fix:
            text += f". Fix: {self.fix}"
        return text

    def __reduce__(self):
        # picklable (pytest-xdist, multiprocessing) with its cause, fix and context
        return (_rebuild, (type(self), self.cause, self.fix, self.context))


def _rebuild(cls, cause, fix, context):
    err = cls.__new__(cls)
    StellarError.__init__(err, cause, fix=fix, **context)
    return err


# --- E1xxx: memory registration and DMA buffers ------------------------------------------

class MemoryError_(StellarError):
    """Memory registration or a DMA buffer failed (named with a trailing underscore so that
    it does not shadow the built-in ``MemoryError``)."""

    code = "E1000"


class MrRegistrationTimeout(MemoryError_, TimeoutError):
    """The device did not finish a memory-region command in time."""

    code = "E1001"
    default_fix = ("check that the device is alive (`stellar info` reads its ID register) and "
                   "not held in reset; if it is, raise the driver's poll limit only if the "
                   "device is known to be slow (a simulation at a low clock rate)")


class BufferNotMappable(MemoryError_, ValueError):
    """A buffer given for DMA cannot be used zero-copy (read-only, not contiguous, empty)."""

    code = "E1002"
    default_fix = ("pass a writable, C-contiguous buffer (a bytearray, an mmap opened for "
                   "writing, a numpy array with flags.writeable and flags.c_contiguous: "
                   "numpy.ascontiguousarray(a) makes one); the driver never copies behind "
                   "your back")


class DmaMappingError(MemoryError_):
    """The IOMMU (or the simulated host memory) refused to map a buffer for DMA."""

    code = "E1003"
    default_fix = ("raise the locked-memory limit (`ulimit -l unlimited`, or LimitMEMLOCK= in "
                   "a systemd unit): the IOMMU pins every mapped page and counts it against "
                   "RLIMIT_MEMLOCK")


class DeviceMemoryOnly(MemoryError_):
    """The backend has no DMA to host memory (a board behind the UART bridge)."""

    code = "E1004"
    default_fix = ("use the board's device memory regions (the memory-region table's bus "
                   "addresses are device-memory addresses there), or a PCIe backend (VFIO, the "
                   "simulated PCIe host) for host-memory DMA")


# --- E2xxx: keys and protection ----------------------------------------------------------

class ProtectionError(StellarError):
    code = "E2000"


class InvalidLkey(ProtectionError, ValueError):
    """A work request names a local key that is not a registered memory region of this
    protection domain."""

    code = "E2001"
    default_fix = "use the lkey of a memory region registered (reg_mr) in the QP's protection domain"


class LocalBoundsError(ProtectionError, ValueError):
    """A scatter/gather entry reaches outside its memory region."""

    code = "E2002"
    default_fix = ("keep addr .. addr + length inside the memory region (mr.addr .. mr.addr + "
                   "mr.length), or register a larger region")


class RemoteAccessError(ProtectionError):
    """The remote side refused an RDMA access: the rkey is unknown or stale, belongs to
    another protection domain or tenant, lacks the right, or the range is out of bounds."""

    code = "E2003"
    default_fix = ("exchange the rkey again after the peer re-registered the region; the peer "
                   "must register it with the access right (REMOTE_WRITE / REMOTE_READ) in the "
                   "protection domain of the QP the request arrives on, and the range must lie "
                   "inside it")


# --- E3xxx: queues ---------------------------------------------------------------------

class QueueError(StellarError):
    code = "E3000"


class QueueFull(QueueError):
    """No credit left on a send, receive or completion queue: every slot holds work the device
    has not consumed yet."""

    code = "E3008"
    default_fix = ("poll the completion queue to retire finished work before posting more, "
                   "post fewer or unsignaled-batched requests, or create the QP with a larger "
                   "max_send_wr / max_recv_wr (and the CQ with a larger cqe)")


# --- E4xxx: QP state -------------------------------------------------------------------

class QpStateError(StellarError):
    code = "E4000"


class InvalidQpTransition(QpStateError, ValueError):
    """A modify_qp asked for a state change the RC state machine does not allow, or left out
    an attribute the transition requires."""

    code = "E4001"
    default_fix = ("move the QP along RESET -> INIT -> RTR -> RTS with the attributes each step "
                   "needs (INIT: port, pkey, access flags; RTR: dest QPN, rq_psn, path MTU, "
                   "address; RTS: sq_psn, timeout, retry_cnt, rnr_retry); any state may go to "
                   "RESET or ERROR")


class QpInErrorState(QpStateError):
    """Work was posted to a QP in ERROR: the device would flush it, so the driver refuses."""

    code = "E4002"
    default_fix = ("poll the CQ to collect the flushed completions, then recover the QP by the "
                   "reset path: modify_qp to RESET, then INIT -> RTR -> RTS again (with fresh "
                   "PSNs agreed with the peer)")


# --- E5xxx: devices and backends ----------------------------------------------------------

class DeviceError(StellarError):
    code = "E5000"


class DeviceNotFound(DeviceError, FileNotFoundError):
    code = "E5001"
    default_fix = ("list the PCI devices with `lspci -D -d 10ee:` (or `lspci -D`) and pass the "
                   "full address, domain included (0000:03:00.0)")


class DeviceNotBound(DeviceError):
    """The device is bound to another driver (or none), not vfio-pci."""

    code = "E5002"


class IommuGroupNotViable(DeviceError):
    """Another device of the same IOMMU group is bound to a host driver."""

    code = "E5003"


class DevicePermissionError(DeviceError, PermissionError):
    code = "E5004"


class VfioUnavailable(DeviceError):
    """The kernel lacks what the VFIO backend needs (vfio-pci, an IOMMU, type1v2)."""

    code = "E5005"


class VfioIoctlError(DeviceError, OSError):
    """A VFIO or iommufd ioctl failed; ``errno`` and ``ioctl`` name which and why."""

    code = "E5006"


class IrqTimeout(DeviceError, TimeoutError):
    code = "E5007"
    default_fix = ("check that the interrupt is enabled on the device (the CQ armed, the "
                   "moderation timer set) and that the vector number is one the device has")


class IrqUnavailable(DeviceError):
    """The backend or device offers no such interrupt vector."""

    code = "E5008"


class DeviceClosed(DeviceError):
    code = "E5009"
    default_fix = "open the device again; nothing can be done on a closed device"


# --- E6xxx: device tables ------------------------------------------------------------------

class TableError(StellarError, RuntimeError):
    """A table command the device refused or could not complete (stellar.host.tables)."""

    code = "E6001"


class FlowTableFull(TableError):
    """The flow table found no room for a new key (table and stash full)."""

    code = "E6002"
    default_fix = "delete unused QPs or build the gateware with a larger flow-table capacity"


def _all_errors():
    out, todo = {}, [StellarError]
    while todo:
        cls = todo.pop()
        out.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return out


#: code -> class, for documentation and for looking an error up by its code. Subclasses defined
#: in other modules (the UART bus errors) join when their module is imported; call
#: ``errors_by_code()`` for the current table.
ERRORS = _all_errors()


def errors_by_code():
    """Every error class known now, by code (includes subclasses defined in other modules)."""
    return _all_errors()
