"""The aotc artifact format: metadata and an integrity hash embedded in the model's .so.

The compiler links a read-only symbol ``aotc_metadata`` holding
``AOTC_META_V1:<sha256 hex>:<json>`` into the library (assembled from the bytes with
``.incbin``: no C compiler pass over a metadata table that can run to megabytes). The hash
is the SHA-256 of the whole file with those 64 hex digits zeroed, so any change to the file
(code, weights, metadata) is detected before the library is ever dlopen'ed. It guards against
corruption and accidental edits, not against an attacker who can also recompute the hash.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from pathlib import Path

from aotc.errors import ArtifactError

MARKER = b"AOTC_META_V1:"
HASH_LEN = 64
ZERO_HASH = b"0" * HASH_LEN


def metadata_blob(metadata: dict) -> bytes:
    """Bytes the compiler embeds (with a zero hash to be patched after linking)."""
    return MARKER + ZERO_HASH + b":" + json.dumps(metadata, sort_keys=True).encode() + b"\0"


def _locate(data) -> int:
    start = data.find(MARKER)
    if start < 0:
        raise ArtifactError("no aotc metadata found: not a library built by aotc")
    if data.find(MARKER, start + 1) >= 0:
        raise ArtifactError("more than one aotc metadata block: file is corrupt")
    return start + len(MARKER)


def _digest(data, hash_at: int) -> str:
    h = hashlib.sha256()
    h.update(data[:hash_at])
    h.update(ZERO_HASH)
    h.update(data[hash_at + HASH_LEN:])
    return h.hexdigest()


def seal(path: Path) -> str:
    """Write the file's hash into its metadata block, in place (compiler side, after linking,
    on the staging copy that is then moved into place)."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        at = _locate(data)
        with memoryview(data) as view:
            digest = _digest(view, at)
        data[at:at + HASH_LEN] = digest.encode()
        data.flush()
    return digest


def read_metadata(path: str | Path, verify: bool = True) -> dict:
    """Metadata of an artifact; with ``verify``, refuse a file whose hash does not match."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            at = _locate(data)
        except ArtifactError as err:
            raise ArtifactError(f"{path}: {err}") from None
        stored = bytes(data[at:at + HASH_LEN]).decode("ascii", "replace")
        end = data.find(b"\0", at)
        raw = bytes(data[at + HASH_LEN + 1:end])
        if verify:
            actual = _digest(memoryview(data), at)
            if actual != stored:
                raise ArtifactError(f"{path}: integrity check failed "
                                    f"(embedded hash {stored[:16]}..., "
                                    f"file hashes to {actual[:16]}...): the file was modified "
                                    "or corrupted after it was built; rebuild it")
    try:
        meta = json.loads(raw)
    except ValueError:
        raise ArtifactError(f"{path}: aotc metadata is not valid JSON") from None
    meta["hash"] = stored
    return meta
