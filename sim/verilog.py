"""Verilog export cache: one generated Verilog file per (design, parameter set, gateware version).

Every cocotb test needs the Verilog of its design. Converting with Amaranth (and Yosys) takes a
second or more per design, and under ``pytest -n auto`` several workers ask for the same file at
once. :func:`export_verilog` converts once and then reuses the file:

    build/verilog/<name>/<slug>-<digest>/<name>.v

``<slug>`` is a readable rendering of the parameters (:func:`param_slug`, e.g. ``width512``);
``<digest>`` hashes the parameters, the factory's own source file, every Python source file of
the ``stellar.hdl`` package and the Amaranth version. Editing any gateware file therefore
changes the digest and the next export regenerates; an existing file is up to date by
construction and is returned without touching Amaranth.

Concurrency: the conversion runs under an exclusive ``fcntl`` lock on a file next to the output,
so a second worker waits for the first instead of converting again, and the result is written
to a temporary file and published with :func:`os.replace`, so no reader ever sees a half-written
file (not even one that ignores the lock).
"""

import fcntl
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import amaranth
from amaranth.back import verilog

__all__ = ["export_verilog", "param_slug", "source_digest"]

# Longest readable part of a slug; the rest of a 255-byte file name is left for the digest and
# keeps paths printable in logs.
_SLUG_MAX = 80
_UNSAFE = re.compile(r"[^A-Za-z0-9.]+")


def _render_value(value) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return "x".join(_render_value(v) for v in value)
    if hasattr(value, "name") and hasattr(value, "value"):  # enum members: their name reads best
        return str(value.name)
    return str(value)


def _canonical(params: Mapping) -> str:
    # JSON with sorted keys is stable across processes for plain values (int, str, bool, float,
    # lists, enums via repr). Objects whose repr carries an address would hash differently each
    # run: that costs a regeneration, never a stale file.
    return json.dumps(dict(params), sort_keys=True, default=repr)


def param_slug(params: Mapping) -> str:
    """A readable, filesystem-safe name for a parameter set, unique per parameter set.

    ``{"width": 512}`` gives ``width512``; several parameters are joined with ``-`` in sorted key
    order (``vlan1-width64``); an empty set gives ``default``. When the readable rendering loses
    information (characters replaced, or truncated to stay short) a short hash of the parameters
    is appended so two different sets never share a name. Use it as the ``params_slug`` of
    :func:`stellar.sim.runner.run_cocotb` so each parameter set gets its own simulator build.
    """
    if not params:
        return "default"
    parts = [f"{key}{_render_value(value)}" for key, value in sorted(params.items())]
    raw = "-".join(parts)
    safe = "-".join(_UNSAFE.sub("_", part) for part in parts)
    if safe == raw and len(safe) <= _SLUG_MAX:
        return safe
    short = hashlib.sha256(_canonical(params).encode()).hexdigest()[:8]
    return f"{safe[:_SLUG_MAX]}-{short}"


def _hdl_package_dir() -> Path:
    spec = importlib.util.find_spec("stellar.hdl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("stellar.hdl is not importable; install the project with `make venv`")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _factory_target(factory: Callable):
    # The class or function whose source defines the design: functools.partial hides it in
    # .func, a callable object in its class.
    while isinstance(factory, functools.partial):
        factory = factory.func
    if inspect.isclass(factory) or inspect.isfunction(factory) or inspect.ismethod(factory):
        return factory
    return type(factory)


def _factory_identity(factory: Callable) -> str:
    # Stable across processes (no addresses), so all xdist workers agree on the file name.
    # A partial's bound arguments shape the design just like params do.
    if isinstance(factory, functools.partial):
        bound = _canonical({"args": factory.args, "keywords": factory.keywords})
        return f"{_factory_identity(factory.func)}{bound}"
    target = _factory_target(factory)
    return f"{target.__module__}.{target.__qualname__}"


def _factory_file(factory: Callable) -> Path | None:
    try:
        source = inspect.getsourcefile(_factory_target(factory))
    except TypeError:  # builtins and C callables have no source file
        return None
    return Path(source).resolve() if source else None


def source_digest(factory: Callable | None = None) -> str:
    """Hash of the gateware sources that a generated file depends on.

    Covers every ``*.py`` under the ``stellar.hdl`` package (path and contents), the Amaranth
    version, and the file that defines ``factory`` when it lives outside the package (a test
    that declares its own small component invalidates its cache when it is edited, too).
    """
    hasher = hashlib.sha256()
    hasher.update(f"amaranth {amaranth.__version__}\n".encode())
    hdl_dir = _hdl_package_dir()
    files = sorted(p for p in hdl_dir.rglob("*.py") if "__pycache__" not in p.parts)
    if factory is not None:
        extra = _factory_file(factory)
        if extra is not None and hdl_dir not in extra.parents:
            files.append(extra)
    for path in files:
        data = path.read_bytes()
        hasher.update(f"{path}\n".encode())
        hasher.update(data)
        _check_not_stale(path, data)
    return hasher.hexdigest()


# Contents of every gateware module this process has imported, as first seen. A long-running
# process (make bench) elaborates with the modules it imported at its start; if someone edits
# them meanwhile, the on-disk digest names a design this process cannot produce, and caching
# its old design under the new digest would hand stale Verilog to every later run.
_SEEN = {}


def _check_not_stale(path, data):
    loaded = {Path(m.__file__).resolve() for m in list(sys.modules.values())
              if getattr(m, "__file__", None)}
    if path.resolve() not in loaded:
        return
    first = _SEEN.setdefault(path.resolve(), hashlib.sha256(data).digest())
    if first != hashlib.sha256(data).digest():
        raise RuntimeError(f"{path} changed after this process imported it: its designs would "
                           "be stale; restart the process to export Verilog")


def export_verilog(name: str, factory: Callable[..., object], params: Mapping, *,
                   build_root: str | os.PathLike = "build") -> Path:
    """Generate (or reuse) the Verilog of ``factory(**params)`` and return its absolute path.

    Parameters
    ----------
    name:
        Verilog module name of the top and file name (``<name>.v``); this is the ``toplevel``
        to give the simulator.
    factory:
        Callable returning an ``amaranth.lib.wiring.Component``; its signature becomes the top's
        ports (single-underscore AXI names at the edge, plus ``clk``/``rst`` of the ``sync``
        domain that Amaranth adds itself).
    params:
        Keyword arguments for ``factory``; plain values (int, str, bool, enums, tuples).
        Together with the sources they must determine the design: a lambda or closure that
        captures other configuration would share one cache entry between configurations, so
        pass everything that shapes the design as params (or as a ``functools.partial``'s
        bound arguments, which are hashed too).
    build_root:
        Root of generated files; the result lands in
        ``<build_root>/verilog/<name>/<param_slug>-<digest>/<name>.v``.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r} is not a valid Verilog module name")
    hasher = hashlib.sha256()
    hasher.update(_canonical(params).encode())
    hasher.update(_factory_identity(factory).encode())
    hasher.update(source_digest(factory).encode())
    slug = f"{param_slug(params)}-{hasher.hexdigest()[:10]}"
    out_dir = Path(build_root).resolve() / "verilog" / name / slug
    out = out_dir / f"{name}.v"
    if out.is_file():
        return out

    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():  # another worker generated it while this one waited for the lock
            return out
        component = factory(**params)
        text = verilog.convert(component, name=name)
        tmp = out_dir / f".{name}.v.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out)
    return out
