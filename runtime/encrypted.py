"""Encrypted models: a compiled ``.so`` sealed with AES-256-GCM, decrypted into memory only.

File layout: ``AOTC_ENC_V1\\0`` (12 bytes), a 12-byte random nonce, then the library encrypted
with AES-256-GCM and its 16-byte tag; the 12-byte header is authenticated too. Any changed
byte, or a wrong key, fails the tag check before anything is loaded. The runtime decrypts into
an anonymous memory file (``memfd_create``) and loads the library from there: the plaintext
never reaches a disk. The key (32 bytes) comes from a key file (the raw bytes, or 64 hex
digits) or the environment: ``AOTC_MODEL_KEY`` (hex) or ``AOTC_MODEL_KEY_FILE``.

AES-GCM comes from ``cryptography`` (``pip install cryptography``), imported only when an
encrypted model is written or read."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from aotc.errors import ArtifactError

MAGIC = b"AOTC_ENC_V1\0"
NONCE_BYTES = 12
KEY_BYTES = 32


def is_encrypted(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read_key(key_file: str | Path | None = None) -> bytes:
    """The key from ``key_file``, else from AOTC_MODEL_KEY (hex) or AOTC_MODEL_KEY_FILE."""
    if key_file is None and os.environ.get("AOTC_MODEL_KEY"):
        return _parse_key(os.environ["AOTC_MODEL_KEY"].encode(), "AOTC_MODEL_KEY")
    key_file = key_file or os.environ.get("AOTC_MODEL_KEY_FILE")
    if not key_file:
        raise ArtifactError("the model is encrypted: give its key (a key file, "
                            "AOTC_MODEL_KEY or AOTC_MODEL_KEY_FILE)")
    try:
        data = Path(key_file).read_bytes()
    except OSError as err:
        raise ArtifactError(f"cannot read the key file {key_file}: {err.strerror}") from None
    return _parse_key(data, str(key_file))


def _parse_key(data: bytes, where: str) -> bytes:
    if len(data) == KEY_BYTES:
        return data
    text = data.strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ArtifactError(f"{where}: not a 256-bit key (32 raw bytes or 64 hex digits)")
    return key


def new_key_file(path: str | Path) -> None:
    """A new random key, as hex, in a file only its owner may read (refuses to overwrite)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(KEY_BYTES) + "\n")


def _aesgcm(key: bytes):
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ArtifactError("encrypted models need the 'cryptography' package "
                            "(pip install cryptography)") from None
    return AESGCM(key)


def encrypt(plain: bytes, key: bytes) -> bytes:
    nonce = secrets.token_bytes(NONCE_BYTES)
    return MAGIC + nonce + _aesgcm(key).encrypt(nonce, plain, MAGIC)


def decrypt(sealed: bytes, key: bytes, name: str) -> bytes:
    cipher = _aesgcm(key)  # first: it says clearly when cryptography is missing
    from cryptography.exceptions import InvalidTag
    if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + NONCE_BYTES + 16:
        raise ArtifactError(f"{name}: not an encrypted aotc model")
    nonce = sealed[len(MAGIC):len(MAGIC) + NONCE_BYTES]
    try:
        return cipher.decrypt(nonce, sealed[len(MAGIC) + NONCE_BYTES:], MAGIC)
    except InvalidTag:
        raise ArtifactError(f"{name}: cannot decrypt: wrong key, or the file was changed") \
            from None


class InMemoryLibrary:
    """The decrypted library in an anonymous memory file; ``path`` names it for dlopen and
    for reading its metadata while this object (its descriptor) lives."""

    def __init__(self, plain: bytes, name: str):
        self.fd = os.memfd_create(f"aotc:{name}", os.MFD_CLOEXEC)
        _write_all(self.fd, plain)
        self.path = Path(f"/proc/{os.getpid()}/fd/{self.fd}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def open_encrypted(path: Path, key_file: str | Path | None = None) -> InMemoryLibrary:
    plain = decrypt(path.read_bytes(), read_key(key_file), str(path))
    return InMemoryLibrary(plain, path.name)


def read_metadata(path: str | Path, key_file: str | Path | None = None) -> dict:
    """The metadata of a compiled library, encrypted or not, without loading it (an
    encrypted one is decrypted into memory for the read)."""
    from .artifact import read_metadata as read_plain
    if not is_encrypted(path):
        return read_plain(path)
    memory = open_encrypted(Path(path), key_file)
    try:
        return read_plain(memory.path)
    finally:
        memory.close()


def encrypt_file(plain_path: str | Path, output: str | Path, key_file: str | Path | None) -> None:
    """Write ``plain_path`` (a compiled library) encrypted to ``output``, atomically."""
    from aotc.atomic import write_bytes
    key = read_key(key_file)
    write_bytes(output, encrypt(Path(plain_path).read_bytes(), key))


def staging_folder() -> str | None:
    """Where a library to be encrypted is built: memory-backed /dev/shm when there is one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
