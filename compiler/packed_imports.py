"""Links the model's serialized VM executable (bytecode and every constant) and aotc's metadata
into the .so as ELF objects written here, in place of TVM's default: an LLVM module holding
the bytes as one constant array, which LLVM then compiles. Same symbol, same bytes, same loader.

The bytes are TVM's packed-imports format (``PackImportsToBytes`` in TVM's codegen.cc: the
import tree, then each module's type key and bytes), assembled here from pieces: the VM
executable writes its own bytes to a file (``SaveToBytes``, what the format holds), and the
kernel copies that file into the object. TVM's own ``ModulePackImportsToTensor`` held four
copies of a model's weights in memory at once (the executable's bytes, the import stream, the
header-prefixed string, the returned tensor); here the process holds one, briefly. A module
kind whose bytes only TVM's serializer can give (a CUDA module's) takes TVM's path.

For machines without an ELF writer here the ``.incbin`` path remains.

Used as ``export_library(..., fpack_imports=imports_packer(arch))``."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import tvm

# x86-64 ELF: data past 2 GiB from the code needs the large-data section (TVM's codegen_blob
# moves blobs over 1 GiB there for the same reason).
_LARGE_DATA = 1 << 30
_SHF_X86_64_LARGE = 0x10000000
_ELF_MACHINE = {"x86_64": 62, "aarch64": 183}  # e_machine: EM_X86_64, EM_AARCH64
_ALIGN = 64


def imports_packer(arch: str):
    """``fpack_imports`` for ``export_library`` on a ``arch`` (platform.machine()) target."""

    def pack_imports(module, is_system_lib: bool, symbol_prefix: str,
                     workspace_dir: str) -> str:
        """Write the packed imports of ``module`` as an object (or assembler file) that defines
        TVM's library-binary symbol over them; return its path."""
        if is_system_lib or symbol_prefix:
            raise ValueError("aotc builds shared libraries only (no system-lib prefix)")
        symbol = str(tvm.get_global_func("runtime.ModuleImportsBlobName")())
        data = packed_imports(module, workspace_dir)
        if data is None:
            data = np.from_dlpack(tvm.get_global_func("runtime.ModulePackImportsToTensor")(module))
            return write_blob(data, symbol, arch, workspace_dir, "aotc_imports")
        path = write_blob(data, symbol, arch, workspace_dir, "aotc_imports")
        for part in data.parts:   # copied into the object: their pages go back now
            if isinstance(part, Path):
                part.unlink()
        return path

    return pack_imports


class Chunks:
    """Bytes to write in order: pieces in memory and whole files (the kernel copies those)."""

    def __init__(self, parts: list):
        self.parts = [p if isinstance(p, Path) else memoryview(p).cast("B") for p in parts]

    @property
    def size(self) -> int:
        return sum(p.stat().st_size if isinstance(p, Path) else p.nbytes for p in self.parts)

    def write_to(self, f) -> None:
        for part in self.parts:
            if isinstance(part, Path):
                f.flush()
                with open(part, "rb") as src:
                    _copy_file(src, f)
            else:
                f.write(part)


def _copy_file(src, dst) -> None:
    """All of ``src`` appended to ``dst`` (both open files), in the kernel where it can."""
    remaining = os.fstat(src.fileno()).st_size
    try:
        while remaining > 0:
            copied = os.copy_file_range(src.fileno(), dst.fileno(), remaining)
            if copied == 0:
                break
            remaining -= copied
    except OSError:  # no copy_file_range between these files (older kernels, some filesystems)
        pass
    dst.seek(0, os.SEEK_END)
    if remaining > 0:
        src.seek(-remaining, os.SEEK_END)
        shutil.copyfileobj(src, dst, 1 << 20)


def as_chunks(data) -> Chunks:
    return data if isinstance(data, Chunks) else Chunks([np.ascontiguousarray(
        np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data, np.uint8)])


def packed_imports(module, folder: str) -> Chunks | None:
    """TVM's packed-imports bytes for ``module`` (what ``ModulePackImportsToTensor`` returns),
    each VM executable's bytes left in a file of ``folder``; None where a module's bytes only
    TVM's serializer can give, or the import tree is one TVM would refuse."""
    layout = _module_groups(module)
    if layout is None:
        return None
    groups, row_ptr, children = layout
    parts: list = [_vector(row_ptr) + _vector(children)]
    for i, group in enumerate(groups):
        head = group[0]
        if head.is_compilation_exportable():
            parts.append(_string(b"_lib"))   # the library's own code: the DSO itself
        elif head.is_binary_serializable():
            if head.kind != "relax.VMExecutable":
                return None
            path = Path(folder) / f"module{i}.bin"
            head.write_to_file(str(path))    # VMExecutable::WriteToFile: its SaveToBytes
            parts += [_string(head.kind.encode()) + _u64(path.stat().st_size), path]
    body = Chunks(parts)
    return Chunks([_u64(body.size), *body.parts])


def _module_groups(root):
    """TVM's ModuleSerializer (codegen.cc) index: modules in depth-first order from ``root``,
    every compilation-exportable one (the kernels' libraries) merged into one group placed
    after all their parents; then the import tree between groups as row pointers and child
    indices. None where TVM would refuse the tree (a merge that makes a cycle)."""
    def key(m):
        return m.__chandle__()

    visited, stack, boundary = {key(root)}, [root], []
    index: dict[int, int] = {}
    groups: list[list] = []

    def push_imports(node) -> None:
        for m in node.imports:
            if key(m) not in visited:
                visited.add(key(m))
                stack.append(m)

    while stack:                      # phase 0: expand all but the exportable modules
        node = stack.pop()
        if node.is_compilation_exportable():
            boundary.append(node)
        else:
            index[key(node)] = len(groups)
            groups.append([node])
            push_imports(node)
    if boundary:                      # phase 1: one group for them, then their children
        merged = len(groups)
        groups.append([])
        stack = boundary
        while stack:
            node = stack.pop()
            if node.is_compilation_exportable():
                groups[merged].append(node)
                index[key(node)] = merged
            else:
                index[key(node)] = len(groups)
                groups.append([node])
            push_imports(node)
    row_ptr, children = [0], []
    for parent, group in enumerate(groups):
        kids = sorted({index[key(im)] for m in group for im in m.imports} - {parent})
        if kids and kids[0] <= parent:
            return None
        children += kids
        row_ptr.append(len(children))
    return groups, row_ptr, children


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _string(data: bytes) -> bytes:
    """TVM's serializer for a string: its length, then its bytes."""
    return _u64(len(data)) + data


def _vector(values: list[int]) -> bytes:
    return _u64(len(values)) + b"".join(_u64(v) for v in values)


def write_blob(data, symbol: str, arch: str, folder: str, stem: str) -> str:
    """A file the linker takes that defines the global ``symbol`` over the bytes ``data`` (a
    uint8 array, bytes or Chunks): an ELF object for the machines of _ELF_MACHINE, else an
    assembler file that ``.incbin``s them. Returns its path."""
    chunks = as_chunks(data)
    large = chunks.size > _LARGE_DATA
    if arch in _ELF_MACHINE:
        path = os.path.join(folder, f"{stem}.o")
        write_elf_object(path, symbol, chunks, arch, large=large and arch == "x86_64")
        return path
    blob_path = os.path.join(folder, f"{stem}.bin")
    with open(blob_path, "wb") as f:
        chunks.write_to(f)
    path = os.path.join(folder, f"{stem}.s")
    with open(path, "w", encoding="ascii") as f:
        f.write(incbin_source(symbol, blob_path, ".lrodata" if large else ".rodata"))
    return path


def write_elf_object(path: str, symbol: str, data, arch: str, large: bool = False) -> None:
    """A little-endian ELF64 relocatable object: ``data`` (as write_blob takes it) in a
    read-only data section (``.lrodata``, x86-64's large-data section, with ``large``), one
    global object symbol over all of it, and an empty ``.note.GNU-stack`` (the stack stays
    non-executable)."""
    section = ".lrodata" if large else ".rodata"
    names = [b"", section.encode(), b".symtab", b".strtab", b".note.GNU-stack", b".shstrtab"]
    shstrtab, name_at = _string_table(names)
    strtab, symbol_at = _string_table([b"", symbol.encode()])
    chunks = as_chunks(data)
    size = chunks.size
    data_at = _ALIGN
    strtab_at = data_at + size
    symtab_at = _aligned(strtab_at + len(strtab), 8)
    symtab = bytes(24) + struct.pack("<IBBHQQ", symbol_at[1], 0x11, 0, 1, 0, size)
    shstrtab_at = symtab_at + len(symtab)
    headers_at = _aligned(shstrtab_at + len(shstrtab), 8)
    flags = 0x2 | (_SHF_X86_64_LARGE if large else 0)  # SHF_ALLOC
    sections = [
        bytes(64),
        _section(name_at[1], 1, flags, data_at, size, 0, 0, _ALIGN, 0),    # PROGBITS
        _section(name_at[2], 2, 0, symtab_at, len(symtab), 3, 1, 8, 24),  # SYMTAB -> .strtab
        _section(name_at[3], 3, 0, strtab_at, len(strtab), 0, 0, 1, 0),    # STRTAB
        _section(name_at[4], 1, 0, headers_at, 0, 0, 0, 1, 0),             # .note.GNU-stack
        _section(name_at[5], 3, 0, shstrtab_at, len(shstrtab), 0, 0, 1, 0),
    ]
    header = (b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, SysV
              + struct.pack("<HHIQQQIHHHHHH", 1, _ELF_MACHINE[arch], 1, 0, 0, headers_at, 0,
                            64, 0, 0, 64, len(sections), len(sections) - 1))
    with open(path, "wb") as f:
        f.write(header.ljust(data_at, b"\0"))
        chunks.write_to(f)
        f.write(strtab)
        f.write(bytes(symtab_at - strtab_at - len(strtab)))
        f.write(symtab)
        f.write(shstrtab)
        f.write(bytes(headers_at - shstrtab_at - len(shstrtab)))
        f.write(b"".join(sections))


def _string_table(strings: list[bytes]) -> tuple[bytes, list[int]]:
    table, offsets = b"", []
    for s in strings:
        if s == b"":
            offsets.append(0)
            table = table or b"\0"
            continue
        offsets.append(len(table))
        table += s + b"\0"
    return table, offsets


def _section(name: int, kind: int, flags: int, offset: int, size: int, link: int, info: int,
             align: int, entsize: int) -> bytes:
    return struct.pack("<IIQQQQIIQQ", name, kind, flags, 0, offset, size, link, info, align,
                       entsize)


def _aligned(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def incbin_source(symbol: str, blob_path: str, section: str = ".rodata") -> str:
    """GNU assembler source defining the global ``symbol`` over the bytes of ``blob_path``
    (every target's toolchain assembles it; no compiler pass over the bytes)."""
    if any(c in blob_path for c in '"\\\n'):
        raise ValueError(f"path {blob_path!r} cannot be named in an .incbin")
    return (f'\t.section {section},"a"\n'
            f"\t.globl {symbol}\n"
            f"\t.type {symbol}, %object\n"
            f"{symbol}:\n"
            f'\t.incbin "{blob_path}"\n'
            f"\t.size {symbol}, . - {symbol}\n"
            '\t.section .note.GNU-stack,"",%progbits\n')
