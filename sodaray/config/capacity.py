"""What a run needs against what this machine has: the device named, memory before allocating, and
the model's context for the positions a search uses."""

from __future__ import annotations

import contextlib
import os
from typing import Any


def check_device(text: str) -> None:
    """A device this machine has: cpu, cuda[:i] (with CUDA), mps (with MPS)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"--device {text}: not a device (cpu, cuda, cuda:1, mps)") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {text}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type != "cpu" and not (device.type == "mps" and torch.backends.mps.is_available()):
        raise ValueError(f"--device {text}: not available here (use cpu or cuda)")


# ---- memory -----------------------------------------------------------------------------------
def available_memory() -> int | None:
    """Bytes of memory available to a new allocation on this machine (None when unknown)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def check_memory(
    needed: float, what: str, available: int | None = None, hint: str = "make it smaller"
) -> None:
    """Refuse before allocating when `needed` bytes exceed what the machine has."""
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        raise MemoryBudgetError(
            f"{what} needs about {format_bytes(needed)} but only {format_bytes(available)} "
            f"is available; {hint}"
        )


class MemoryBudgetError(ValueError):
    """A size whose memory exceeds what the machine (or device) has."""


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# Float32 (B, n, V) buffers a search state keeps: SODA holds Z, Adam's two moments, the
# probabilities and the gradient; GCG its one-hot gradient and candidates.
STATE_BUFFERS = 5


def dataset_bytes(lengths: list[int], per_length: int) -> float:
    """Rough peak memory of building a dataset: Python rows (ids, text, labels) and Arrow copy."""
    return float(per_length) * sum(400 + 80 * n for n in lengths)


# For a model whose config names no context: longer than any model's (and bounds every plan).
MAX_POSITIONS = 1 << 20


def check_context(model: Any, length: int, output_tokens: int) -> None:
    """The fixed context, the searched input and the observed output must fit the model."""
    limit = getattr(model, "max_positions", None) or MAX_POSITIONS
    check_positions(limit, len(getattr(model, "prefix_ids", []) or []), length, output_tokens)


def check_positions(
    limit: int, fixed: int, length: int, output_tokens: int, whose: str = "the model's"
) -> None:
    """`fixed` context positions, an input of `length` and `output_tokens` observed must fit a
    context of `limit` positions (`whose` names the model in the message: "stories260K's")."""
    total = fixed + length + output_tokens
    if total > limit:
        raise ValueError(
            f"input length {length} + {output_tokens} output tokens"
            + (f" + {fixed} fixed" if fixed else "")
            + f" = {total} positions exceed {whose} context of {limit}"
        )


def check_state_memory(model: Any, batch: int, length: int, algorithm: str) -> None:
    """Refuse a (B, n, V) search state that does not fit, before allocating it."""
    vocab = int(model.vocab_size)
    if algorithm == "embedding":  # (B, n, d) state; distances in vocab chunks
        vocab = int(model.embedding_matrix.shape[1]) + 8192
    what = f"a search state of {batch} targets x {length} positions x {vocab}"
    needed = float(STATE_BUFFERS) * 4 * batch * length * vocab
    free = None  # not CUDA, or the driver cannot say: the machine's memory (`check_memory`)
    if getattr(model.device, "type", "cpu") == "cuda":
        import torch

        with contextlib.suppress(RuntimeError, AssertionError):
            free = int(torch.cuda.mem_get_info(model.device)[0])
    check_memory(needed, what, free, "lower max_batch_size or the length")
