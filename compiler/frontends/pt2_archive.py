"""A ``.pt2`` is checked before ``torch.export.load`` reads it: nothing in it may be unpickled.

``torch.export.load`` reads the graph as JSON and tensors as raw bytes, but falls back to
pickle for several members: legacy weight and constant files (``data/weights/<model>.pt``),
payloads marked ``use_pickle`` (tensor subclasses), torchbind and opaque constants
(``custom_obj_*``, ``opaque_obj_*``), sample inputs that ``weights_only`` loading refuses, and
the whole pre-2.7 archive format; AOTInductor members are shared libraries it loads. A pickle
can run any code, and a ``.pt2`` is a file users download, so such archives are refused with a
ModelLoadError naming the member, unless the caller trusts the file (``trust_pickle``).

The archive is read once into memory: the bytes checked are the bytes torch loads."""

from __future__ import annotations

import io
import json
from pathlib import Path

from aotc.errors import ModelLoadError

_ADVICE = ("a pickle can run any code. Re-export it with torch.export.save (torch >= 2.7 "
           "writes tensors as raw data), or pass --trust-pickle (trust_pickle=True) if you "
           "trust where the file came from")


def checked_bytes(path: Path, trust_pickle: bool = False) -> io.BytesIO:
    """The archive's bytes, after checking that loading them unpickles nothing (unless
    ``trust_pickle``)."""
    data = path.read_bytes()
    if not trust_pickle:
        problem = _pickle_member(data)
        if problem:
            raise ModelLoadError(f"{path}: refused: loading it would {problem}; {_ADVICE}")
    return io.BytesIO(data)


def _pickle_member(data: bytes) -> str | None:
    from torch.export.pt2_archive._package import PT2ArchiveReader
    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
    except (RuntimeError, AssertionError):
        return "read an archive older than torch 2.7, whose tensors are pickled" \
            if _is_legacy_archive(data) else None  # not an archive: torch's error says so
    names = set(reader.get_file_names())
    models = [n[len("models/"):-len(".json")] for n in names
              if n.startswith("models/") and n.endswith(".json")]
    if any(n.startswith("data/aotinductor/") for n in names):
        return "load the AOTInductor shared library it carries (data/aotinductor/)"
    for model in models:
        problem = (_legacy_member(names, model) or _config_problem(reader, names, model)
                   or _sample_inputs_problem(reader, names, model))
        if problem:
            return problem
    return None


def _is_legacy_archive(data: bytes) -> bool:
    import zipfile
    try:
        return "version" in zipfile.ZipFile(io.BytesIO(data)).namelist()
    except zipfile.BadZipFile:
        return False


def _legacy_member(names: set[str], model: str) -> str | None:
    for member in (f"data/weights/{model}.pt", f"data/constants/{model}.pt"):
        if member in names:
            return f"unpickle {member} (legacy weights format)"
    return None


def _config_problem(reader, names: set[str], model: str) -> str | None:
    for config in (f"data/weights/{model}_weights_config.json",
                   f"data/constants/{model}_constants_config.json"):
        if config not in names:
            continue
        try:
            entries = json.loads(reader.read_string(config))["config"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return f"parse {config}, which is not a payload config"
        for fqn, meta in entries.items():
            path_name = str(meta.get("path_name", ""))
            if meta.get("use_pickle") or path_name.startswith(("custom_obj_", "opaque_obj_")):
                return f"unpickle {path_name or fqn} ({fqn}, listed in {config})"
    return None


def _sample_inputs_problem(reader, names: set[str], model: str) -> str | None:
    """torch tries ``weights_only`` first and falls back to a full unpickle: try it here."""
    import torch
    member = f"data/sample_inputs/{model}.pt"
    if member not in names:
        return None
    payload = reader.read_bytes(member)
    if not payload:
        return None
    try:
        torch.load(io.BytesIO(payload), weights_only=True)
    except Exception:  # weights_only refuses with several exception types (UnpicklingError,
        # RuntimeError, AttributeError...): any refusal means torch would unpickle it for real
        return f"unpickle {member} (sample inputs that weights_only loading refuses)"
    return None
