"""Compile cache for Verilator's global runtime objects, shared by every model build.

Each Verilator model links its own copy of the runtime (``verilated.o``, ``verilated_dpi.o``,
``verilated_vpi.o``, ``verilated_threads.o``), compiled from ``$VERILATOR_ROOT/include`` with the
same flags in every build directory: about 9 CPU-seconds per model, the same object ~20 times a
suite. :mod:`stellar.sim.runner` sets Verilator's ``OBJCACHE`` make variable (the hook meant for
ccache) to a wrapper that sends only those compiles here; every other compile (the model's own
C++, cocotb's ``verilator.cpp``, which includes the model's ``Vtop.h``) runs unchanged.

A cached object is keyed by the complete command line (output name aside), the compiler binary
(path, size, modification time) and the path, size and modification time of every file under
``$VERILATOR_ROOT/include`` (the sources and headers these objects are made from), so a
different flag (``VM_TRACE=1`` for waves), another compiler or another Verilator gets its own
entry. A hit copies the object and its ``-MMD`` dependency file into the build directory; a miss
compiles as usual and stores both (written to a temporary name and renamed, so a concurrent
build never reads a partial file).

Run as ``python -I objcache.py <cache dir> <compiler command...>``: standard library only, so
the four compiles a model build sends here do not pay for importing the package.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def _key(cmd, out, root):
    hasher = hashlib.sha256()
    hasher.update(json.dumps([arg if arg != out else "<out>" for arg in cmd]).encode())
    cxx = shutil.which(cmd[0])
    if cxx is None:
        return None
    real = os.path.realpath(cxx)
    st = os.stat(real)
    hasher.update(f"{real}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for path in sorted((root / "include").rglob("*")):
        if path.is_file():
            st = path.stat()
            hasher.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return hasher.hexdigest()[:40]


def _publish(src, dst):
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def main(argv):
    cache, cmd = Path(argv[0]), argv[1:]
    root = os.environ.get("VERILATOR_ROOT")
    if "-o" not in cmd or not root:
        return subprocess.call(cmd)
    out = cmd[cmd.index("-o") + 1]
    key = _key(cmd, out, Path(root))
    if key is None:
        return subprocess.call(cmd)
    obj, dep = cache / f"{key}.o", cache / f"{key}.d"
    out_obj = Path(out)
    out_dep = out_obj.with_suffix(".d")
    if obj.is_file() and dep.is_file():
        _publish(dep, out_dep)
        _publish(obj, out_obj)
        return 0
    rc = subprocess.call(cmd)
    if rc == 0 and out_obj.is_file() and out_dep.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        _publish(out_dep, dep)
        _publish(out_obj, obj)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
