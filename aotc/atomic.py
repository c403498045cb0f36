"""Files written whole or not at all: the content goes to a temporary file in the destination's
own folder (the same filesystem, so the final rename is atomic), is fsync'd, and then replaces
the destination with ``os.replace``; the folder is fsync'd so that the rename survives a crash.
A writer killed at any point leaves either the previous file or the new one, never a truncated
mix (``shutil.move`` across filesystems is a copy and a delete: a kill mid-copy lost both)."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(dest: str | Path):
    """Yields a temporary path beside ``dest``; when the block ends without an error, that
    file (fsync'd) replaces ``dest``. On an error the temporary file is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, dest)
        _fsync_folder(dest.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def copy_into_place(src: str | Path, dest: str | Path) -> None:
    """Copy ``src`` (on any filesystem) to ``dest`` atomically, keeping its mode."""
    with replacing(dest) as tmp:
        shutil.copyfile(src, tmp)
        shutil.copymode(src, tmp)


def write_bytes(dest: str | Path, data: bytes) -> None:
    with replacing(dest) as tmp:
        tmp.write_bytes(data)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    try:
        _fsync(folder)
    except OSError:  # some filesystems refuse to open or fsync a directory: the rename stands
        pass
