"""Flush-to-zero for denormal floats on every CPU thread torch computes on, for one block.

Why: x86 cores handle denormal operands in microcode, and SODA's backward leaves denormals in
the gradients entering the q/k/v matmuls, which then run 3-8x slower.

`torch.set_flush_denormal` sets the calling thread's mode only, while the kernels run on the
OpenMP pool's threads, so the mode is also set inside one OpenMP parallel region
(`GOMP_parallel`, exported by GNU and Intel OpenMP), whose team is torch's pool. Where that
runtime cannot be found, only the calling thread is switched: slower, never wrong. torch has no
getter for the mode, so leaving the block restores the default (off).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_Callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# One callback per mode, so no state is shared between Python threads (each has its own pool).
_CALLBACKS = {on: _Callback(lambda _, on=on: torch.set_flush_denormal(on)) for on in (True, False)}


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded, found in this process's memory map (Linux)."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            lib = line.split()[-1]
            if Path(lib).name.startswith(("libgomp", "libiomp5")):
                runtime = ctypes.CDLL(lib)
                runtime.GOMP_parallel.restype = None
                return runtime
    except (OSError, AttributeError) as exc:
        log.debug("no OpenMP runtime to set the denormal mode on: %s", exc)
    return None


def _set_all_threads(on: bool) -> None:
    torch.set_flush_denormal(on)
    runtime = _openmp_runtime()
    if runtime is not None:
        # num_threads 0: the team torch's next parallel region would get (its intra-op pool).
        runtime.GOMP_parallel(_CALLBACKS[on], None, 0, 0)


@contextlib.contextmanager
def flush_denormals(device: torch.device | str = "cpu") -> Iterator[None]:
    """Denormals flushed to zero on the CPU inside the block, the default (off) after it; a
    no-op for another `device` (GPUs handle denormals at full speed)."""
    if torch.device(device).type != "cpu":
        yield
        return
    _set_all_threads(True)
    try:
        yield
    finally:
        _set_all_threads(False)
