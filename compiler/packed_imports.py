"""Links the model's serialized VM executable (bytecode and every constant) and aotc's metadata
into the .so as ELF objects written here, in place of TVM's default: an LLVM module holding
the bytes as one constant array, which LLVM then compiles. Same symbol, same bytes, same loader.

The object is written in one pass from the serialized bytes, so a model's weights are copied
once on their way to the linker (an assembler ``.incbin`` of a file wrote them twice more: the
file, then the assembler's object). For machines without an ELF writer here the ``.incbin``
path remains.

Used as ``export_library(..., fpack_imports=imports_packer(arch))``."""

from __future__ import annotations

import os
import struct

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
        blob = tvm.get_global_func("runtime.ModulePackImportsToTensor")(module)
        symbol = str(tvm.get_global_func("runtime.ModuleImportsBlobName")())
        return write_blob(np.from_dlpack(blob), symbol, arch, workspace_dir, "aotc_imports")

    return pack_imports


def write_blob(data, symbol: str, arch: str, folder: str, stem: str) -> str:
    """A file the linker takes that defines the global ``symbol`` over the bytes ``data`` (a
    uint8 array or bytes): an ELF object for the machines of _ELF_MACHINE, else an assembler
    file that ``.incbin``s them. Returns its path."""
    data = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
    large = data.size > _LARGE_DATA
    if arch in _ELF_MACHINE:
        path = os.path.join(folder, f"{stem}.o")
        write_elf_object(path, symbol, data, arch, large=large and arch == "x86_64")
        return path
    blob_path = os.path.join(folder, f"{stem}.bin")
    data.tofile(blob_path)
    path = os.path.join(folder, f"{stem}.s")
    with open(path, "w", encoding="ascii") as f:
        f.write(incbin_source(symbol, blob_path, ".lrodata" if large else ".rodata"))
    return path


def write_elf_object(path: str, symbol: str, data: np.ndarray, arch: str,
                     large: bool = False) -> None:
    """A little-endian ELF64 relocatable object: ``data`` in a read-only data section
    (``.lrodata``, x86-64's large-data section, with ``large``), one global object symbol
    over all of it, and an empty ``.note.GNU-stack`` (the stack stays non-executable)."""
    section = ".lrodata" if large else ".rodata"
    names = [b"", section.encode(), b".symtab", b".strtab", b".note.GNU-stack", b".shstrtab"]
    shstrtab, name_at = _string_table(names)
    strtab, symbol_at = _string_table([b"", symbol.encode()])
    size = int(data.size)
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
        f.write(memoryview(np.ascontiguousarray(data, np.uint8)))
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
