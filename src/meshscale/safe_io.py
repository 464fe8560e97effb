"""Every file meshscale reads or writes goes through here, so one rule holds in every command.

In: a path must name a regular file (a pipe, a device, a socket or a folder is refused before it is opened, so
nothing blocks), its name must fit the system's limits, a symlink loop is one line, and reads are bounded.

Out: checked before any work (its folder exists and is writable, not under /proc, /sys or /dev), then written to a
uniquely named temporary file beside the target and renamed over it, the temporary file removed on any failure
(a full disk, a signal). A symlinked output is replaced by the file, never written through: the rename replaces
the link itself, and the checks look at the link, not at what it points to.

Scratch files in the temporary folder carry the owner's process id, so that the next run removes those of a run
that was killed before it could (SIGKILL, a power cut).
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from meshscale.errors import MeshscaleError
from meshscale.units import is_digits

MAX_TEXT_BYTES = 64 << 20   # system and result files are kilobytes to a few megabytes
_NO_OUTPUT_UNDER = (Path("/proc"), Path("/sys"), Path("/dev"))
_SCRATCH_PREFIX = "meshscale-"


def _limits(path: Path) -> tuple[int, int]:
    """(longest path, longest name) in bytes on the file system holding ``path``: POSIX's figures if unknown."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        return os.pathconf(folder, "PC_PATH_MAX"), os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 4096, 255


def check_path_length(path: Path, where: str) -> None:
    """Refuse a path or one of its names longer than the file system allows, and names with a newline or NUL."""
    text = str(path)
    if "\x00" in text or "\n" in text:
        raise MeshscaleError(f"{where}: a path with a newline or NUL character; rename it")
    longest_path, longest_name = _limits(path)
    encoded = os.fsencode(text)
    if len(encoded) >= longest_path:
        raise MeshscaleError(f"{where}: the path is {len(encoded)} bytes, longer than the {longest_path} allowed")
    for part in path.parts:
        if len(os.fsencode(part)) > longest_name:
            raise MeshscaleError(f"{where}: the name {part[:24]}... is {len(os.fsencode(part))} bytes, longer than "
                                 f"the {longest_name} allowed")


# ---- in ---------------------------------------------------------------------------------------------------

def input_file(path: str | Path, what: str = "file") -> Path:
    """``path`` if it names a regular file that exists (links followed); one line otherwise."""
    path = Path(path)
    check_path_length(path, str(path)[:200])
    try:
        info = os.stat(path)
    except OSError as exc:
        raise MeshscaleError(f"{path}: cannot read ({exc.strerror or exc}); give a {what}") from None
    _require_regular(path, info.st_mode, what)
    return path


def _require_regular(path: Path, mode: int, what: str) -> None:
    if stat.S_ISDIR(mode):
        raise MeshscaleError(f"{path}: is a directory; give a {what}")
    if not stat.S_ISREG(mode):
        kind = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise MeshscaleError(f"{path}: is {kind}, not a regular file; give a {what}")


def read_bytes(path: str | Path, what: str = "file", limit_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit_bytes``; one line for anything else.

    The file is opened non-blocking and checked again on the open descriptor, so a pipe swapped in after the
    first check cannot block the read."""
    path = input_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise MeshscaleError(f"{path}: cannot read ({exc.strerror or exc}); give a {what}") from None
    try:
        info = os.fstat(fd)
        _require_regular(path, info.st_mode, what)
        if info.st_size > limit_bytes:
            raise MeshscaleError(f"{path}: {info.st_size} bytes is too large for a {what} "
                                 f"(at most {limit_bytes >> 20} MiB)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit_bytes + 1)
    except OSError as exc:
        raise MeshscaleError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > limit_bytes:  # a file that grew while read
        raise MeshscaleError(f"{path}: too large for a {what} (at most {limit_bytes >> 20} MiB)")
    return data


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of ``path`` (see `read_bytes`); one line when it is not UTF-8."""
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MeshscaleError(f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
                             f"give a {what} saved as UTF-8") from None


# ---- out --------------------------------------------------------------------------------------------------

def _forbidden(path: Path) -> bool:
    try:  # the link itself is replaced, so where it points does not matter: resolve its folder only
        resolved = path.parent.resolve() / path.name
    except (OSError, RuntimeError):  # a loop among the folders
        return True
    return any(resolved == root or root in resolved.parents for root in _NO_OUTPUT_UNDER)


def _is_dir(path: Path) -> bool:
    """A folder (a link to one counts: the user meant the folder)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def check_output_file(path: str | Path | None, option: str, suffixes: tuple[str, ...] | None = None) -> Path | None:
    """``path`` if a file can be written there: its folder exists and is writable, it is not a folder itself,
    not under /proc, /sys or /dev, and (if ``suffixes``) its suffix is one of them. Creates nothing. A symlink
    there (even a dangling or looping one) will be replaced by the file."""
    if path is None:
        return None
    path = Path(path)
    if not str(path) or str(path).endswith(os.sep) or path.name in ("", ".", ".."):
        raise MeshscaleError(f"{option} {path}: give a file name, not a folder")
    check_path_length(path, f"{option} {str(path)[:200]}")
    if suffixes and path.suffix.lower() not in suffixes:
        raise MeshscaleError(f"{option} {path}: use a {' or '.join(suffixes)} file name")
    if _forbidden(path):
        raise MeshscaleError(f"{option} {path}: not a place for output files; choose a path in a normal folder")
    if _is_dir(path):
        raise MeshscaleError(f"{option} {path}: is a folder; give a file name")
    if not path.is_symlink() and path.exists() and not os.access(path, os.W_OK):
        raise MeshscaleError(f"{option} {path}: the file is not writable; choose another path")
    _check_folder(path.parent, option, path)
    return path


def check_output_dir(path: str | Path | None, option: str) -> Path | None:
    """``path`` if a folder can be written there: it is a writable folder, or the nearest existing ancestor
    is one (the folders will be created when the output is written). Creates nothing."""
    if path is None:
        return None
    path = Path(path)
    check_path_length(path, f"{option} {str(path)[:200]}")
    if _forbidden(path):
        raise MeshscaleError(f"{option} {path}: not a place for output files; choose a path in a normal folder")
    if path.exists():
        _check_folder(path, option, path)
        return path
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        if ancestor.is_symlink():  # a dangling link
            break
        ancestor = ancestor.parent
    _check_folder(ancestor, option, path)
    return path


def _check_folder(folder: Path, option: str, path: Path) -> None:
    folder = folder if str(folder) else Path(".")
    if not folder.exists():
        raise MeshscaleError(f"{option} {path}: cannot write, folder {folder} does not exist; create it or choose another path")
    if not folder.is_dir():
        raise MeshscaleError(f"{option} {path}: cannot write, {folder} is not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MeshscaleError(f"{option} {path}: cannot write, folder {folder} is not writable; choose another path")


def atomic_write(path: str | Path, data: str | bytes | Callable[[Path], Any]) -> Path:
    """Write ``data`` (text, bytes, or a function that writes the file it is given) to ``path`` through a
    uniquely named temporary file in the same folder, renamed into place: a failure (a full disk, an exception
    of the writer, a signal) leaves neither a partial file nor the temporary one. A symlink at ``path`` is
    replaced, not followed. Anything the writer raises other than an OSError passes through unchanged."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=f".tmp{path.suffix}", dir=folder)
    except OSError as exc:
        raise MeshscaleError(f"cannot write {path} ({exc.strerror or exc}); choose a writable path") from None
    tmp = Path(tmp_name)
    new = not os.path.lexists(path)
    with _removed_on_signal(tmp):
        try:
            if callable(data):
                os.close(fd)
                data(tmp)
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise MeshscaleError(f"cannot write {path} ({exc.strerror or exc}); choose a writable path") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    if new and _written:
        _written[-1].append(path)
    return path


_written: list[list[Path]] = []  # the new files of each open `new_outputs_removed_on` block


@contextmanager
def new_outputs_removed_on(errors: type[BaseException] | tuple, unless: type[BaseException] | tuple = ()
                           ) -> Iterator[None]:
    """Files that `atomic_write` creates within the block are removed again when it ends with one of ``errors``
    (but not ``unless``): a command that fails after its first output (a full disk at the second) leaves none
    of them behind, while a run that failed part-way keeps what it saved of its finished work."""
    record: list[Path] = []
    _written.append(record)
    try:
        yield
    except errors as exc:
        for path in record if not isinstance(exc, unless) else ():
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
        raise
    finally:
        _written.pop()


class AppendLog:
    """A text file that grows a line at a time (a run's log), each line flushed so that a crash loses none.

    A symlink at the path is replaced by a new file (as `atomic_write` replaces it), never written through. A
    write that fails (a full disk) cuts the file back to its last whole line and raises one line: the log holds
    whole lines only (a log this run created and never wrote a line to is removed)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            if self.path.is_symlink():
                self.path.unlink()
            self._created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), 0o666)
            self._file = os.fdopen(fd, "a", encoding="utf-8")
            self._good_bytes = self._file.seek(0, os.SEEK_END)
        except OSError as exc:
            raise MeshscaleError(f"cannot write {self.path} ({exc.strerror or exc}); choose a writable path") from None

    def write_line(self, text: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(text + "\n")
            self._file.flush()
            self._good_bytes = self._file.tell()
        except OSError as exc:
            self._abandon()
            raise MeshscaleError(f"cannot write {self.path} ({exc.strerror or exc}); the log keeps its whole "
                                 "lines; free space or choose another path") from None

    def _abandon(self) -> None:
        file, self._file = self._file, None
        try:
            os.truncate(self.path, self._good_bytes)
            if self._created and self._good_bytes == 0:
                self.path.unlink()
        except OSError:
            pass
        try:
            file.close()
        except OSError:
            pass

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- leftovers of signals and killed runs --------------------------------------------------------------------

_pending: set[Path] = set()
_pending_lock = threading.Lock()
_handlers_installed = False


class _removed_on_signal:
    """While the block runs, ``path`` is removed if the process ends: normally, by an exception, or by SIGTERM or
    SIGHUP (which then end the process as they would have)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        _install_handlers()
        with _pending_lock:
            _pending.add(self.path)
        return self.path

    def __exit__(self, *exc: Any) -> None:
        with _pending_lock:
            _pending.discard(self.path)


def _remove_pending() -> None:
    with _pending_lock:
        for path in list(_pending):
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
        _pending.clear()


def _install_handlers() -> None:
    """Remove pending temporary files at exit and on SIGTERM / SIGHUP, then let the signal do what it did."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    atexit.register(_remove_pending)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(signum)
        if previous is not signal.SIG_DFL:  # someone else handles it (the launcher's stop); leave theirs
            continue

        def handler(number: int, frame: Any, _signum: int = signum) -> None:
            _remove_pending()
            signal.signal(_signum, signal.SIG_DFL)
            os.kill(os.getpid(), _signum)

        signal.signal(signum, handler)


def scratch_file(kind: str, suffix: str = "") -> Path:
    """A new empty file ``meshscale-<kind>-<pid>-XXXX<suffix>`` in the temporary folder, removed at exit or on
    SIGTERM / SIGHUP; first removes the leftovers of earlier runs whose process is gone."""
    remove_stale_scratch(kind)
    fd, name = tempfile.mkstemp(prefix=f"{_SCRATCH_PREFIX}{kind}-{os.getpid()}-", suffix=suffix)
    os.close(fd)
    path = Path(name)
    _install_handlers()
    with _pending_lock:
        _pending.add(path)
    return path


def release_scratch(path: Path) -> None:
    """Remove a `scratch_file` now."""
    with _pending_lock:
        _pending.discard(path)
    path.unlink(missing_ok=True)


def remove_stale_scratch(kind: str) -> int:
    """Remove ``meshscale-<kind>-<pid>-*`` files and folders of processes that no longer run (and the old unnamed
    ``meshscale-<kind>-*`` ones an hour old); return how many."""
    removed = 0
    for path in Path(tempfile.gettempdir()).glob(f"{_SCRATCH_PREFIX}{kind}-*"):
        owner = path.name[len(_SCRATCH_PREFIX) + len(kind) + 1:].split("-", 1)[0]
        try:
            stale = (not process_alive(int(owner))) if is_digits(owner) else _age_s(path) > 3600
            if not stale or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            if path.is_dir():
                shutil.rmtree(path)
            elif path.is_file():
                path.unlink()
            else:
                continue
            removed += 1
        except (OSError, ValueError):
            continue
    return removed


def process_alive(pid: int) -> bool:
    """True while a process of that id exists (a zombie included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(path: Path) -> float:
    import time
    return time.time() - path.stat().st_mtime
