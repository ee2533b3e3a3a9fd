"""What a model's files must be before transformers reads them: a GGUF file whole (its header
and the tensor data it describes within the file: an interrupted download is said to be one),
safetensors and torch weight files readable, tokenizer files regular files that parse. Each check
reads headers only and ends in one `ModelLoadError` line naming the file.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from sodaray.errors import first_line
from sodaray.io.files import parse_json, read_config, what_is


class ModelLoadError(ValueError):
    """The model could not be loaded (unknown id, missing file, unsupported format)."""


# GGUF value types (the format's `gguf_type`): the byte size of each fixed-size one; 8 is a
# string (u64 length, then bytes), 9 an array (u32 element type, u64 count, then elements).
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAX_DIMS = 8  # GGML_MAX_DIMS is 4; a larger count is a damaged header
_GGUF_KEYS = 64  # llama.cpp writes general.architecture first; a file that has none soon lacks it
_GGUF_TEXT = 1 << 16  # bytes a key or the architecture may take, where the architecture is read
_GGUF_CHECKED: dict[tuple[str, int, int, bool], str | None] = {}


class _Cut(Exception):
    """The GGUF header runs past the end of the file."""


def check_gguf_file(
    path: str | os.PathLike, error: type[Exception] = ModelLoadError, architecture: bool = False
) -> str | None:
    """Refuse, in one `error` line naming `path`, a file that is not a whole GGUF model (either
    byte order): no GGUF magic bytes, cut short (the header or the tensor data it describes runs
    past the end), or a damaged header. Only the header is read, every count checked against the
    bytes left; a file that passed is not read again while its size and time stamp stay the same.
    Why: transformers' GGUF readers end a cut file in a traceback naming no file. `architecture`:
    return `general.architecture` (transformers' model type; Gemma 3's `gemma3` loads as
    `gemma3_text`) from the first 64 keys alone, None if they lack it, refusing a key or the
    architecture over 64 KiB and an array of strings or arrays before it: a hostile file costs
    little time and memory."""
    import mmap

    p = Path(path).expanduser()
    try:
        info = p.stat()
        size = info.st_size
        key = (str(p.resolve()), size, info.st_mtime_ns, architecture)
        if key in _GGUF_CHECKED:
            return _GGUF_CHECKED[key]
        if size < 4:
            raise error(f"{path}: {size} bytes, not a GGUF model file (empty or cut short)")
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF":
                raise error(
                    f"{path}: not a GGUF model file (it does not start with the bytes GGUF)"
                )
            found = _gguf_header(data, error, path, architecture)
    except _Cut as exc:
        raise error(
            f"{path}: GGUF file cut short ({size:,} bytes; its header runs past the "
            "end): damaged or an interrupted download"
        ) from exc
    except OSError as exc:
        raise error(f"{path}: cannot read it ({first_line(exc)})") from exc
    if len(_GGUF_CHECKED) > 64:
        _GGUF_CHECKED.clear()
    _GGUF_CHECKED[key] = found
    return found


def _gguf_header(data: Any, error: type[Exception], path: object, architecture: bool) -> str | None:
    """`check_gguf_file`'s reading of the header in `data` (a buffer of the whole file); `_Cut`
    when the header itself runs past the end, `error` when it is damaged."""
    import struct

    size = len(data)
    pos = 4
    order = "<"  # little-endian, as nearly every GGUF file; a big-endian one's version says so

    def skip(count: int, width: int) -> None:
        nonlocal pos
        if count * width > size - pos:
            raise _Cut
        pos += count * width

    def take(fmt: str) -> int:  # one number
        skip(1, width := struct.calcsize(order + fmt))
        return struct.unpack_from(order + fmt, data, pos - width)[0]

    def text() -> bytes:  # a key, or the architecture
        length = take("Q")
        if architecture and length > _GGUF_TEXT:
            raise error(f"{path}: a GGUF header string of {length:,} bytes (at most 64 KiB)")
        skip(length, 1)
        # Only a short key is compared (a hostile multi-GB one is not copied).
        return bytes(data[pos - length : pos]) if length <= _GGUF_TEXT else b""

    def skip_value(kind: int, depth: int = 0) -> int | None:
        if kind in _GGUF_SIZES:  # read as unsigned: only general.alignment's value is used
            return take({1: "B", 2: "H", 4: "I", 8: "Q"}[_GGUF_SIZES[kind]])
        if kind == _GGUF_STRING:
            return skip(take("Q"), 1)
        if kind == _GGUF_ARRAY and depth < 4:
            inner, count = take("I"), take("Q")
            if inner in _GGUF_SIZES:
                return skip(count, _GGUF_SIZES[inner])
            if architecture:
                raise error(
                    f"{path}: general.architecture is not among the GGUF header's first keys"
                )
            if count > size - pos:  # each element takes at least a byte
                raise _Cut
            for _ in range(count):
                skip_value(inner, depth + 1)
            return None
        raise error(f"{path}: damaged GGUF header (value type {kind} at byte {pos:,})")

    version = take("I")
    if version not in (2, 3) and int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
        order, pos = ">", 4
        version = take("I")
    if version not in (2, 3):
        raise error(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensors, fields = take("Q"), take("Q")
    if tensors > size or fields > size:  # each takes more than a byte of header
        raise _Cut
    alignment = 32
    for _ in range(min(fields, _GGUF_KEYS) if architecture else fields):
        name, kind = text(), take("I")
        if architecture and name == b"general.architecture" and kind == _GGUF_STRING:
            return text().decode("utf-8")
        value = skip_value(kind)
        if name == b"general.alignment" and isinstance(value, int) and value > 0:
            alignment = value
    if architecture:
        return None
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError as exc:  # transformers needs it to read the file at all
        raise error(
            f"{path}: reading a GGUF file needs the gguf package (pip install gguf)"
        ) from exc
    end = 0
    for _ in range(tensors):
        skip(take("Q"), 1)  # the tensor's name
        if (dims := take("I")) > _GGUF_MAX_DIMS:
            raise error(f"{path}: damaged GGUF header ({dims} dimensions in a tensor)")
        shape = [take("Q") for _ in range(dims)]
        kind, offset = take("I"), take("Q")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError) as exc:
            raise error(f"{path}: damaged GGUF header (tensor type {kind})") from exc
        end = max(end, offset + math.prod(shape) // block * block_bytes)
    end += -(-pos // alignment) * alignment  # the data starts aligned after the header
    if end > size:
        raise error(
            f"{path}: GGUF file truncated: its tensor data ends at byte {end:,} but the file "
            f"has {size:,} bytes (damaged or an interrupted download)"
        )
    return None


def check_weight_files(folder: str | os.PathLike, error: type[Exception] = ModelLoadError) -> None:
    """Refuse, in one `error` line naming the file, a weight file directly in a local model
    `folder` that is damaged or cut short: a `*.bin` in torch's zip format whose zip directory
    (at its end) cannot be read, or a `*.safetensors` whose header is damaged or describes more
    data than the file holds. Only headers and directories are read. A hub id is left alone."""
    import zipfile

    root = Path(folder).expanduser()
    if not root.is_dir():
        return

    def unreadable(file: Path, what: str, exc: BaseException) -> Exception:
        return error(
            f"cannot load model {file}: not a readable {what} file ({first_line(exc)}): "
            "damaged or an interrupted download"
        )

    for file in sorted(root.glob("*.bin")):
        try:
            if not file.is_file():
                continue
            with file.open("rb") as f:
                if f.read(4) != b"PK\x03\x04":  # torch's older format: left to the loader
                    continue
            with zipfile.ZipFile(file):
                pass
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise unreadable(file, "torch weight", exc) from exc
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:  # transformers reads .bin files without it
        return
    for file in sorted(root.glob("*.safetensors")):
        try:
            if file.is_file():
                with safe_open(str(file), framework="pt"):
                    pass
        except (SafetensorError, OSError) as exc:
            raise unreadable(file, "safetensors", exc) from exc


def weight_file_errors() -> tuple[type[BaseException], ...]:
    """What a corrupt or truncated weight file raises (safetensors' own error type)."""
    try:
        from safetensors import SafetensorError

        return (SafetensorError,)
    except ImportError:
        return ()


# A tokenizer's JSON files, in the order a damaged one is looked for.
TOKENIZER_JSON = (
    *("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json"),
    "added_tokens.json",
)
TOKENIZER_FILES = (*TOKENIZER_JSON, "tokenizer.model", "spiece.model", "merges.txt", "vocab.txt")


def check_tokenizer_files(
    folder: str | os.PathLike, error: type[Exception] = ModelLoadError
) -> None:
    """A tokenizer file in a local model `folder` that is there but is not a regular file (a
    FIFO, whose read would block; a directory; a dangling link), refused in one `error` line
    naming it before anything reads it."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        return
    for name in TOKENIZER_FILES:
        path = root / name
        if os.path.lexists(path) and (kind := what_is(path)) != "a regular file":
            raise error(
                f"cannot load the tokenizer: {path} is {kind or 'a dangling link'}, not a "
                "tokenizer file"
            )


def damaged_tokenizer_file(folder: str | os.PathLike) -> str | None:
    """Which of a local model folder's tokenizer files is damaged, as "PATH: why" (one of
    `TOKENIZER_FILES` there that is not a regular file, else the first of `TOKENIZER_JSON`
    that is not a JSON object), or None: a hub id, or no damaged file (a loader's complaint is
    then about something else)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        return None
    try:
        check_tokenizer_files(root, ValueError)
    except ValueError as exc:
        return str(exc).removeprefix("cannot load the tokenizer: ")
    for name in TOKENIZER_JSON:
        path = root / name
        if not path.is_file():
            continue
        try:
            data = parse_json(read_config(path, "tokenizer file", limit=64 << 20), str(path))
        except ValueError as exc:
            text = first_line(exc)
            return text if str(path) in text else f"{path}: {text}"
        if not isinstance(data, dict):
            return f"{path}: not a JSON object"
    return None
