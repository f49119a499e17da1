"""The native libraries Mooncake's wheel links but does not ship, and where its binaries are.

Mooncake 0.3.13 links libibverbs/libmlx5 (and, through them, libnl), libcudart.so.12 and
libcuda.so.1 even for its TCP transport. scripts/bootstrap puts what the system lacks into
`.venv/lib/mooncake-native` (Debian's rdma-core libraries fetched with `apt-get download`, a
stand-in libcuda.so.1 built from no_cuda_driver.c on machines without the NVIDIA driver);
libcudart comes from PyPI (nvidia-cuda-runtime-cu12).

Python processes preload these by absolute path before importing mooncake.store (the dynamic
loader then matches Mooncake's dependencies by soname); the mooncake_master and mooncake_client
binaries get them through LD_LIBRARY_PATH.

Mooncake also binds its P2P handshake listener to 0.0.0.0 and its TCP transport to [::], hard-coded.
Every process that runs Mooncake (the master, the segment holder, each worker whose engine core
holds a store client) starts with `bind_guard_env()`: loopback_bind.c, built by scripts/bootstrap,
preloaded so that those wildcard binds land on one address instead.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from functools import cache
from pathlib import Path

NATIVE_DIR = Path(sys.prefix) / "lib" / "mooncake-native"
# Dependencies first: libibverbs needs libnl, libmlx5 needs libibverbs.
PRELOAD_ORDER = ("libnl-3.so.200", "libnl-route-3.so.200", "libibverbs.so.1", "libmlx5.so.1", "libcuda.so.1")
BIND_GUARD = NATIVE_DIR / "libloopback_bind.so"
BIND_HOST_ENV = "ROLLOUT_SERVE_BIND_HOST"  # where BIND_GUARD puts a wildcard bind (an IPv4 address)


class MooncakeUnavailable(RuntimeError):
    pass


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def cudart_dir() -> Path | None:
    try:
        runtime = _package_dir("nvidia.cuda_runtime")
    except ModuleNotFoundError:
        return None
    return runtime / "lib" if runtime else None


def binary(name: str) -> Path:
    """Path of a binary shipped in the mooncake wheel (mooncake_master, mooncake_client)."""
    package = _package_dir("mooncake")
    path = package / name if package else None
    if path is None or not path.exists():
        raise MooncakeUnavailable(f"{name} not found: install mooncake-transfer-engine (scripts/bootstrap)")
    return path


def library_path_env() -> dict[str, str]:
    """LD_LIBRARY_PATH for Mooncake's binaries: our native directory, libcudart's, then the caller's."""
    dirs = [str(d) for d in (NATIVE_DIR, cudart_dir()) if d is not None and d.exists()]
    inherited = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": ":".join(dirs + ([inherited] if inherited else []))}


def bind_guard_env(host: str) -> dict[str, str]:
    """The environment of a process whose wildcard binds must land on `host` (module docstring)."""
    if not BIND_GUARD.exists():
        raise MooncakeUnavailable(f"{BIND_GUARD} is missing (it keeps Mooncake's listeners off the network): "
                                  "run scripts/bootstrap")
    preload = " ".join(filter(None, (str(BIND_GUARD), os.environ.get("LD_PRELOAD"))))
    return {"LD_PRELOAD": preload, BIND_HOST_ENV: host}


@cache
def store_class():
    """mooncake.store.MooncakeDistributedStore, after preloading the libraries it links."""
    for name in PRELOAD_ORDER:
        path = NATIVE_DIR / name
        if path.exists():
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _load_cudart()
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise MooncakeUnavailable(f"cannot load Mooncake's store client ({exc}); run scripts/bootstrap") from exc
    return MooncakeDistributedStore


def _load_cudart() -> None:
    try:
        ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)  # already loaded (CUDA torch) or on the system
        return
    except OSError:
        pass
    directory = cudart_dir()
    if directory and (directory / "libcudart.so.12").exists():
        ctypes.CDLL(str(directory / "libcudart.so.12"), mode=ctypes.RTLD_GLOBAL)
