"""The one rule for files sodaray reads: a path must name a regular file (through symlinks),
a configuration file (YAML or JSON: sweep, tuning, include, preset, costs, job and lock files)
is read only up to `MAX_CONFIG_BYTES`, and nothing parsed (those files, `KEY=VALUE` overrides,
JSON in a dataset's or result file's metadata and columns) nests deeper than `MAX_NESTING`.

Why: opening a FIFO or a device blocks or never ends, and `Path.is_file()` cannot tell them
from "no such file": `regular_file` says what the path is before anything opens it. A large
YAML file costs seconds and hundreds of MB to parse. The JSON parser recurses per level, so
`parse_json` counts a text's brackets first, in a loop; YAML is held to the same bound as it
is composed (`yamltext.yaml_load`). Past any bound the error is one line.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from sodaray.errors import first_line

MAX_CONFIG_BYTES = 4 << 20  # a configuration file larger than this is not a configuration file
# Levels of lists and mappings any parsed text may nest: sodaray's own files nest under ten; a
# deeper one was written to exhaust a parser (and the code that walks what it returns).
MAX_NESTING = 64

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def what_is(path: str | os.PathLike) -> str | None:
    """What `path` names, following symlinks: None when nothing (or a dangling link), "a
    regular file", or the kind of thing that is not one ("a directory", "a FIFO (named pipe)",
    "a character device", ...)."""
    try:
        return kind_of(os.stat(path).st_mode)
    except (OSError, ValueError):  # nothing there, a name too long, a NUL byte, a loop of links
        return None


def kind_of(mode: int) -> str:
    """What a `stat` mode names: "a regular file", "a symbolic link" (from `lstat`), "a
    directory", "a FIFO (named pipe)", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def regular_file(
    path: str | os.PathLike, what: str, error: type[Exception] = ValueError, where: str = ""
) -> Path:
    """`path` (with `~` expanded) when it names a regular file; else `error`, one line saying
    what is there instead: "no such sweep file: x.yaml", "/dev/zero is a character device,
    not a sweep file". `where` is added to the message ("(included by a.yaml)")."""
    p = Path(path).expanduser()
    suffix = f" {where}" if where else ""
    if (kind := what_is(p)) is None:
        raise error(f"no such {what}: {path}{suffix}")
    if kind != "a regular file":
        raise error(f"{path} is {kind}, not {_article(what)}{suffix}")
    return p


def _article(what: str) -> str:
    return ("an " if what[:1].lower() in "aeiou" else "a ") + what


def read_config(
    path: str | os.PathLike,
    what: str,
    error: type[Exception] = ValueError,
    where: str = "",
    limit: int = MAX_CONFIG_BYTES,
) -> str:
    """A configuration file's text: a regular file (`regular_file`) of at most `limit` bytes,
    UTF-8. One-line `error`s naming the file."""
    p = regular_file(path, what, error, where)
    suffix = f" {where}" if where else ""
    try:
        # Opened without waiting (a FIFO put in its place since the look above would block
        # `open` until a writer came), then looked at again through the open file.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise error(f"{path}: not a regular file once opened: not {_article(what)}{suffix}")
            if info.st_size > limit:
                raise error(
                    f"{path}: {info.st_size:,} bytes is not {_article(what)} "
                    f"(at most {limit:,}){suffix}"
                )
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read it ({first_line(exc)}){suffix}") from exc
    if len(data) > limit:
        raise error(f"{path}: more than {limit:,} bytes is not {_article(what)}{suffix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({first_line(exc)}); save it as UTF-8") from exc


def nesting_problem(depth: int) -> str:
    """The one-line reason a text nests too deep (JSON and YAML alike)."""
    return f"nested more than {MAX_NESTING} levels deep (at least {depth:,})"


# A JSON string (escapes included) or one bracket: what `json_depth` steps over.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def json_depth(text: str, limit: int = MAX_NESTING) -> int:
    """How deep `text`'s JSON lists and objects nest (brackets inside strings aside), counted
    in one loop without recursion; it stops early once past `limit`. Brackets are counted, not
    matched: for valid JSON this is its depth, for invalid JSON at least as much."""
    if (brackets := text.count("[") + text.count("{")) <= limit:
        return brackets  # too few to matter: no scan
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        depth += 1 if token in "[{" else -1 if token in "]}" else 0
        deepest = max(deepest, depth)
        if deepest > limit:
            break
    return deepest


def parse_json(text: str | bytes, what: str = "JSON") -> Any:
    """`json.loads` held to `MAX_NESTING`: every JSON sodaray reads (job and lock files,
    metadata in dataset and result files, `params` columns, JSON Lines sources) goes through
    it. A ValueError of one line (prefixed by `what`) for bad or over-deep JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if (depth := json_depth(text)) > MAX_NESTING:
        raise ValueError(f"{what}: {nesting_problem(depth)}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, numbers too long to convert
        raise ValueError(f"{what}: not valid JSON ({first_line(exc)})") from exc


def read_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> Any:
    """A JSON file's value, read by `read_config`'s rule; bad or over-deep JSON is one line
    naming it (`parse_json`)."""
    text = read_config(path, what, error)
    try:
        return parse_json(text, str(path))
    except ValueError as exc:
        raise error(str(exc)) from exc


def read_json_object(
    path: str | os.PathLike, what: str, error: type[Exception] = ValueError
) -> dict[str, Any]:
    """A JSON file that must hold an object (`{...}`): a list or a number is one line."""
    value = read_json(path, what, error)
    if not isinstance(value, dict):
        raise error(f"{path}: {_article(what)} holds a JSON object, not {type(value).__name__}")
    return value


def shown_url(url: str) -> str:
    """An RDB URL as it may be printed or logged (to MLflow too): its password hidden (a
    journal path: as given)."""
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: nothing of it shown past the scheme
        return url.partition("://")[0] + "://..."


def check_sqlite_url(url: str, what: str, error: type[Exception] = ValueError) -> None:
    """A `sqlite:///PATH` URL (a tracking store, a study's storage) whose PATH exists must be
    a regular file: SQLite opens a FIFO and then waits on it, or fails on a directory with
    "disk I/O error". Other URLs pass."""
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    if not url.startswith("sqlite:///") or path in ("", ":memory:"):
        return
    if (kind := what_is(path)) not in (None, "a regular file"):
        raise error(f"{what} {url}: {path} is {kind}, not a database file")


# What a model folder's weights are called: transformers' safetensors, PyTorch, TF and Flax
# files (and their shards), or a GGUF file.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")


def check_model_files(
    location: str,
    gguf_file: str | None = None,
    error: type[Exception] = ValueError,
    contents: bool = True,
) -> None:
    """A local model path that cannot hold a model, refused before anything loads it: a FIFO
    or device, a file that is not `.gguf`, and (with `contents`) a folder without
    `config.json` or without a weight file (`data build` needs only a tokenizer). Nothing is
    checked where `location` names nothing here (a hub id: a missing local path is the
    caller's own message)."""
    if gguf_file is None and location.endswith(".gguf"):
        regular_file(location, "GGUF model file", error)
        return
    if (kind := what_is(location)) is None:
        return
    if kind == "a regular file":
        raise error(
            f"{location} is a file, not a model folder (give the folder that holds "
            "config.json and the weights, or a .gguf file)"
        )
    if kind != "a directory":
        raise error(f"{location} is {kind}, not a model folder or .gguf file")
    folder = Path(location)
    if gguf_file is not None:
        regular_file(folder / gguf_file, "GGUF model file", error)
        return
    if not contents:
        return
    if (config := what_is(folder / "config.json")) is None:
        raise error(f"{location} holds no config.json: not a model folder")
    if config != "a regular file":
        raise error(f"{folder / 'config.json'} is {config}, not a model's config file")
    check_model_config(folder / "config.json", error)
    if not any(
        f.suffix in WEIGHT_SUFFIXES and what_is(f) == "a regular file" for f in folder.iterdir()
    ):
        raise error(f"{location} holds no weights (no *.safetensors or *.bin file)")


# A model config's sizes, each a whole number from 1 to its bound when given: far above any
# model, far below what hangs or exhausts memory while transformers builds the empty model (a
# `num_hidden_layers` of 10**9 runs for minutes; a negative `vocab_size` is a traceback).
CONFIG_SIZES = (
    {"vocab_size": 1 << 24, "hidden_size": 1 << 18, "intermediate_size": 1 << 20}
    | dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), 10_000)
    | dict.fromkeys(("num_attention_heads", "num_key_value_heads", "n_head", "num_heads"), 1 << 14)
    | {"max_position_embeddings": 1 << 26, "n_embd": 1 << 18, "n_positions": 1 << 26}
)


def check_model_config(
    path: str | os.PathLike, error: type[Exception] = ValueError
) -> dict[str, Any]:
    """A model folder's `config.json`, read by `read_json_object`'s rule (bounded size and
    nesting, one line naming it), whose sizes (`CONFIG_SIZES`, at the top level and in a
    `text_config`) are whole numbers in range: refused here, before transformers builds a
    model from them. Returns the config."""
    config = read_json_object(path, "model's config file", error)
    parts = [("", config)]
    if isinstance(config.get("text_config"), dict):
        parts.append(("text_config.", config["text_config"]))
    for prefix, part in parts:
        for key, bound in CONFIG_SIZES.items():
            if (value := part.get(key)) is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
                raise error(
                    f"{path}: {prefix}{key} must be a whole number from 1 to {bound:,}, "
                    f"not {value!r:.40}"
                )
    return config
