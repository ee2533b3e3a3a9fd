"""The one rule for files sodaray writes, removes and renames.

Why: a results folder that was copied or shared can carry links, and an `--out` can name a
device node: a plain open would write through a link at `.sodaray/jobs/<job>/job.json` to the
file it points to, or replace `/dev/null` with a Parquet file. Every write sodaray makes goes
through `write_file`, and every removal or rename inside an output folder through `remove_file`
and `move_file`:

- `base` is the folder the user gave (`--out DIR`, or the folder of `--out FILE`). It may be
  a link the user chose (`results -> /data/results`) and is followed; nothing beneath it is.
  Each folder below it is opened with O_NOFOLLOW | O_DIRECTORY from its parent's descriptor
  (and made there when missing), so a link, a file or a FIFO where a folder should be is
  refused, and what was checked is what is written into: no name is looked up twice.
- At the file's own name only a regular file (or nothing) may be: a link, a device, a FIFO,
  a socket or a folder there is refused, in one line naming the path and what is there.
- The file is written under a temporary name in its folder, synced, then renamed over the
  name between descriptors: a reader never sees half a file, a crash leaves the old file or
  the new one, and a rename replaces a name, never writes through it.
- A path outside `base` (`..`, another absolute path) is refused (`PathEscape`).

`UnsafeWrite` and `PathEscape` are ValueErrors: the CLI's one line and exit code 2.

`OutputFolder` binds `base` once: a run holds one and writes through its methods, which are
these functions with its `base`.
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
    """Write `path` (a path under `base`, as `base / ...` builds it) atomically by the rule
    above; its missing folders are made. `content`: bytes, text (UTF-8), or a function that
    writes to the open binary file (`pq.write_table`, `savefig`). With `exclusive`, only when
    nothing is at `path` (a lock): False, and nothing written, when something is. True when
    written."""
    top, parts = _parts(base, path)
    name = parts[-1]
    with _folder(top, parts[:-1], create=True) as fd:
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
    """Refuse now what `write_file` would refuse later at any of `paths` (a folder on the way
    that is a link or not a folder, anything but a regular file at the name), so that a
    command fails before its work, not after it. Nothing is made; a missing folder is fine
    (made by the rule when written)."""
    for path in paths:
        top, parts = _parts(base, path)
        with contextlib.suppress(FileNotFoundError), _folder(top, parts[:-1], False) as fd:
            _check_replaceable(fd, parts[-1], path)


def make_folder(base: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Make `path` (a folder under `base`, or `base` itself) and its missing parents by the
    rule: a link or a non-folder on the way is refused."""
    top = Path(os.path.abspath(base))
    _, parts = _parts(base, path, allow_base=True)
    with _folder(top, parts, create=True):
        return Path(path)


def remove_file(base: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Remove the name `path` under `base` (a link there is removed itself, never followed;
    no folder on the way may be a link). False when nothing was there."""
    top, parts = _parts(base, path)
    try:
        with _folder(top, parts[:-1], create=False) as fd:
            os.unlink(parts[-1], dir_fd=fd)
    except FileNotFoundError:
        return False
    return True


def move_file(base: str | os.PathLike, src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename `src` to `dst`, both under `base` (whatever `src` is, it is moved itself; at
    `dst` only a regular file or nothing may be; `dst`'s missing folders are made)."""
    top, src_parts = _parts(base, src)
    _, dst_parts = _parts(base, dst)
    with (
        _folder(top, src_parts[:-1], create=False) as src_fd,
        _folder(top, dst_parts[:-1], create=True) as dst_fd,
    ):
        _check_replaceable(dst_fd, dst_parts[-1], dst)
        os.replace(src_parts[-1], dst_parts[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def touch_file(base: str | os.PathLike, path: str | os.PathLike) -> None:
    """Set a regular file's modification time to now (a lock's refresh); anything else at
    `path`, or nothing, is left alone (a link's target never changes)."""
    top, parts = _parts(base, path)
    with contextlib.suppress(FileNotFoundError), _folder(top, parts[:-1], False) as fd:
        if _kind(parts[-1], fd) == REGULAR:
            os.utime(parts[-1], dir_fd=fd, follow_symlinks=False)


def what_is_at(base: str | os.PathLike, path: str | os.PathLike) -> str | None:
    """What is at `path` itself (a link is "a symbolic link", not its target), its folders
    checked by the rule; None when nothing."""
    top, parts = _parts(base, path)
    try:
        with _folder(top, parts[:-1], create=False) as fd:
            return _kind(parts[-1], fd)
    except FileNotFoundError:
        return None


def prepare_file(base: str | os.PathLike, path: str | os.PathLike) -> Path:
    """`path` made ready for a library that opens it by name itself (Optuna's journal): its
    folders made by the rule, and an empty regular file created unless one is there. Checked
    here, before it is handed over; the library's own opens are outside the rule."""
    top, parts = _parts(base, path)
    with _folder(top, parts[:-1], create=True) as fd:
        _check_replaceable(fd, parts[-1], path)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(parts[-1], _NEW, 0o666, dir_fd=fd))
    return Path(path)


def refusal(path: str | os.PathLike, kind: str, folder: bool = False) -> str:
    """The one line saying why nothing is written at `path`, where `kind` is."""
    if kind == LINK:
        return f"{path} is a symbolic link; sodaray does not write through links"
    if folder:
        return f"{path} is {kind}, not a folder; sodaray writes only into folders"
    return f"{path} is {kind}; sodaray replaces only regular files"


@dataclass(frozen=True)
class OutputFolder:
    """The folder the user gave (`base` above), bound once: each method is the module's
    function of the same rule with this `base`, so a path is given relative to nothing but
    built as `base / ...` (or any path that lies under it)."""

    base: Path

    def write(
        self,
        path: str | os.PathLike,
        content: bytes | str | Callable[[BinaryIO], None],
        *,
        exclusive: bool = False,
    ) -> bool:
        """`write_file` under this folder."""
        return write_file(self.base, path, content, exclusive=exclusive)

    def make_folder(self, path: str | os.PathLike) -> Path:
        """`make_folder` under this folder."""
        return make_folder(self.base, path)

    def remove(self, path: str | os.PathLike) -> bool:
        """`remove_file` under this folder."""
        return remove_file(self.base, path)

    def move(self, src: str | os.PathLike, dst: str | os.PathLike) -> None:
        """`move_file` under this folder."""
        move_file(self.base, src, dst)

    def touch(self, path: str | os.PathLike) -> None:
        """`touch_file` under this folder."""
        touch_file(self.base, path)

    def what_is_at(self, path: str | os.PathLike) -> str | None:
        """`what_is_at` under this folder."""
        return what_is_at(self.base, path)

    def prepare(self, path: str | os.PathLike) -> Path:
        """`prepare_file` under this folder."""
        return prepare_file(self.base, path)

    def check(self, paths: Iterable[str | os.PathLike]) -> None:
        """`check_places` under this folder."""
        check_places(self.base, paths)


# ---- the walk -----------------------------------------------------------------------------------
def _parts(
    base: str | os.PathLike, path: str | os.PathLike, allow_base: bool = False
) -> tuple[Path, list[str]]:
    """`base` made absolute, and `path`'s components below it. Both are made absolute without
    following links: a `..` is taken by name, and a path that then lies outside `base` is
    refused. (By name is safe: no folder below `base` may be a link.)"""
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
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise UnsafeWrite(
                f"{path}: the name {part[:40]}... is {size:,} bytes; a file or folder name "
                f"is at most {NAME_MAX}"
            )
    return top, list(rel.parts)


@contextlib.contextmanager
def _folder(top: Path, parts: list[str], create: bool) -> Iterator[int]:
    """A descriptor of the folder `top/parts...`: `top` followed as given, each part opened
    from its parent's descriptor, never through a link (made first with `create`)."""
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
        yield fd
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
    kind = _kind(name, fd)
    if kind is not None and kind != REGULAR:
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
