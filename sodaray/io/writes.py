"""The one rule for files sodaray writes, removes and renames.

Why: a results folder that was copied or shared can carry links, and an `--out` can name a
device node: a plain open would write through a link to the file it points to, or replace
`/dev/null` with a Parquet file. Every write goes through `write_file`, every removal or rename
inside an output folder through `remove_file` and `move_file`:

- `base` is the folder the user gave (`--out DIR`, or the folder of `--out FILE`), followed if
  a link; nothing beneath it is. Each folder below it is opened with O_NOFOLLOW | O_DIRECTORY
  from its parent's descriptor (made there when missing): a link, a file or a FIFO where a
  folder should be is refused, and no name is looked up twice.
- At the file's own name only a regular file (or nothing) may be; anything else is refused in
  one line naming the path and what is there.
- The file is written under a temporary name in its folder, synced, then renamed over the
  name: a reader never sees half a file, and a rename replaces a name, never writes through it.
- A path outside `base` is refused (`PathEscape`). `UnsafeWrite` and `PathEscape` are
  ValueErrors: the CLI's one line and exit code 2.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sodaray.io.files import kind_of
from sodaray.io.paths import PathEscape

REGULAR = "a regular file"
LINK = "a symbolic link"
# A folder below `base`: never through a link; O_NONBLOCK so that a FIFO in its place cannot
# block the open (O_DIRECTORY refuses it anyway).
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# The longest name (one path component) Linux filesystems take, in bytes.
NAME_MAX = 255
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeWrite(ValueError):
    """A write refused: through a link, over something that is not a regular file, or into
    something that is not a folder."""


def write_file(
    base: str | os.PathLike,
    path: str | os.PathLike,
    content: bytes | str | Callable[[BinaryIO], None],
    *,
    exclusive: bool = False,
) -> bool:
    """Write `path` (under `base`) atomically by the rule above, its missing folders made.
    `content`: bytes, text (UTF-8), or a function that writes to the open binary file. With
    `exclusive`, only when nothing is at `path` (a lock). True when written."""
    with _folder(base, path, create=True) as (fd, name):
        if not exclusive:
            _check_replaceable(fd, name, path)
        # Cut in bytes, not characters: 100 wide characters would pass NAME_MAX.
        short = os.fsencode(name)[:100].decode("utf-8", "ignore")
        tmp = f".{short}.{secrets.token_hex(4)}.tmp"
        out = os.open(tmp, _NEW, 0o666, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                _put(f, content)
                f.flush()
                os.fsync(f.fileno())
            if exclusive:
                return _link(fd, tmp, name, content)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)


def check_places(base: str | os.PathLike, paths: Iterable[str | os.PathLike]) -> None:
    """Refuse now what `write_file` would refuse later at any of `paths`, so that a command
    fails before its work, not after it. Nothing is made; a missing folder is fine."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError), _folder(base, path, False) as (fd, name):
            _check_replaceable(fd, name, path)


def make_folder(base: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Make `path` (a folder under `base`, or `base` itself) and its missing parents by the
    rule: a link or a non-folder on the way is refused."""
    with _folder(base, path, create=True, whole=True):
        return Path(path)


def remove_file(base: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Remove the name `path` under `base` (a link there is removed itself, never followed;
    no folder on the way may be a link). False when nothing was there."""
    with contextlib.suppress(FileNotFoundError), _folder(base, path, False) as (fd, name):
        os.unlink(name, dir_fd=fd)
        return True
    return False


def move_file(base: str | os.PathLike, src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename `src` to `dst`, both under `base` (whatever `src` is, it is moved itself; at
    `dst` only a regular file or nothing may be; `dst`'s missing folders are made)."""
    _parts(base, dst)  # both names checked before anything is opened: an escape is said first
    with (
        _folder(base, src, create=False) as (src_fd, src_name),
        _folder(base, dst, create=True) as (dst_fd, dst_name),
    ):
        _check_replaceable(dst_fd, dst_name, dst)
        os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def touch_file(base: str | os.PathLike, path: str | os.PathLike) -> None:
    """Set a regular file's modification time to now (a lock's refresh); anything else at
    `path`, or nothing, is left alone (a link's target never changes)."""
    with contextlib.suppress(FileNotFoundError), _folder(base, path, False) as (fd, name):
        if _kind(name, fd) == REGULAR:
            os.utime(name, dir_fd=fd, follow_symlinks=False)


def what_is_at(base: str | os.PathLike, path: str | os.PathLike) -> str | None:
    """What is at `path` itself (a link is "a symbolic link", not its target), its folders
    checked by the rule; None when nothing."""
    with contextlib.suppress(FileNotFoundError), _folder(base, path, False) as (fd, name):
        return _kind(name, fd)
    return None


def prepare_file(base: str | os.PathLike, path: str | os.PathLike) -> None:
    """`path` made ready for a library that opens it by name itself (Optuna's journal): its
    folders made and an empty regular file created unless one is there, by the rule."""
    with _folder(base, path, create=True) as (fd, name):
        _check_replaceable(fd, name, path)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(name, _NEW, 0o666, dir_fd=fd))


def refusal(path: str | os.PathLike, kind: str, folder: bool = False) -> str:
    """The one line saying why nothing is written at `path`, where `kind` is."""
    if kind == LINK:
        return f"{path} is a symbolic link; sodaray does not write through links"
    if folder:
        return f"{path} is {kind}, not a folder; sodaray writes only into folders"
    return f"{path} is {kind}; sodaray replaces only regular files"


@dataclass(frozen=True)
class OutputFolder:
    """The folder the user gave (`base` above), bound once: a path-like of `base`, whose
    methods are the module's functions of the same rule with it as their `base`, so a path is
    given relative to nothing but built as `base / ...` (or any path that lies under it)."""

    base: Path

    def __fspath__(self) -> str:
        return os.fspath(self.base)

    __str__ = __fspath__  # messages name the folder, as they name a `base` given as a path

    write = write_file
    make_folder = make_folder
    remove = remove_file
    move = move_file
    touch = touch_file
    what_is_at = what_is_at
    prepare = prepare_file
    check = check_places


# ---- the walk -----------------------------------------------------------------------------------
def _parts(
    base: str | os.PathLike, path: str | os.PathLike, allow_base: bool = False
) -> tuple[Path, list[str]]:
    """`base` made absolute, and `path`'s components below it; a `..` is taken by name (safe:
    no folder below `base` may be a link), and a path then outside `base` is refused."""
    for given in (base, path):
        if "\0" in os.fspath(given):  # the OS refuses it only later, in a line naming nothing
            raise UnsafeWrite(f"{os.fspath(given)!r}: a path cannot hold a NUL byte")
    top = Path(os.path.abspath(base))
    try:
        rel = Path(os.path.abspath(path)).relative_to(top)
    except ValueError:
        raise PathEscape(f"{path} would be written outside {base}") from None
    if not rel.parts and not allow_base:
        raise UnsafeWrite(f"{path} is the folder {base} itself, not a file in it")
    for part in Path(os.path.abspath(path)).parts:
        # Refused before any work: the OS says only "File name too long", after the search.
        if (size := len(os.fsencode(part))) > NAME_MAX:
            raise UnsafeWrite(
                f"{path}: the name {part[:40]}... is {size:,} bytes; a file or folder name "
                f"is at most {NAME_MAX}"
            )
    return top, list(rel.parts)


@contextlib.contextmanager
def _folder(
    base: str | os.PathLike, path: str | os.PathLike, create: bool, whole: bool = False
) -> Iterator[tuple[int, str]]:
    """A descriptor of `path`'s folder (of `path` itself, `whole`) and `path`'s name in it:
    `base` followed as given, each part below it opened from its parent's descriptor, never
    through a link (made first with `create`)."""
    top, parts = _parts(base, path, allow_base=whole)
    parts, name = (parts, "") if whole else (parts[:-1], parts[-1])
    fd = _open_base(top, create)
    try:
        here = top
        for part in parts:
            here = here / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                child = os.open(part, _FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UnsafeWrite(refusal(here, _kind(part, fd) or "nothing", True)) from None
            os.close(fd)
            fd = child
        yield fd, name
    finally:
        os.close(fd)


def _open_base(top: Path, create: bool) -> int:
    """The folder the user gave, links followed (their choice), made when missing."""
    try:
        if create:
            with contextlib.suppress(FileExistsError, NotADirectoryError):  # said by the open
                os.makedirs(top, exist_ok=True)
        return os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
    except NotADirectoryError:
        raise UnsafeWrite(refusal(top, _kind(top) or "nothing", folder=True)) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # others (no room, read-only) stay OSErrors: callers' own
            raise
        raise UnsafeWrite(f"{top} is a loop of symbolic links, not a folder") from None


def _kind(name: str | os.PathLike, dir_fd: int | None = None) -> str | None:
    """What the name itself is (`lstat`), None when nothing."""
    try:
        return kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _check_replaceable(fd: int, name: str, path: str | os.PathLike) -> None:
    if (kind := _kind(name, fd)) not in (None, REGULAR):
        raise UnsafeWrite(refusal(path, kind))


def _put(f: BinaryIO, content: bytes | str | Callable[[BinaryIO], None]) -> None:
    if isinstance(content, bytes):
        f.write(content)
    elif isinstance(content, str):
        f.write(content.encode("utf-8"))
    else:
        content(f)


def _link(fd: int, tmp: str, name: str, content: bytes | str | Callable[[BinaryIO], None]) -> bool:
    """Link the written `tmp` to `name` unless something is there: no reader sees the file
    half written (a lock half written could not be told from garbage)."""
    try:
        os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: an exclusive create instead
        try:
            out = os.open(name, _NEW, 0o666, dir_fd=fd)
        except FileExistsError:
            return False
        with os.fdopen(out, "wb") as f:
            _put(f, content)
        return True
