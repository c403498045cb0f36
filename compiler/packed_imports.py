"""Links the model's serialized VM executable (bytecode and every constant) into the .so as an
assembler ``.incbin`` of a file, in place of TVM's default: an LLVM module holding the bytes as
one constant array, which LLVM then compiles. Same symbol, same bytes, same loader; for a model
with hundreds of MB of weights the default took seconds of a compile.

Used as ``export_library(..., fpack_imports=pack_imports)``."""

from __future__ import annotations

import os

import numpy as np
import tvm

# x86-64 ELF: data past 2 GiB from the code needs the large-data section (TVM's codegen_blob
# moves blobs over 1 GiB there for the same reason).
_LARGE_DATA = 1 << 30


def pack_imports(module, is_system_lib: bool, symbol_prefix: str, workspace_dir: str) -> str:
    """Write the packed imports of ``module`` as a blob plus an assembler file that defines
    TVM's library-binary symbol over it; return the assembler file's path."""
    if is_system_lib or symbol_prefix:
        raise ValueError("aotc builds shared libraries only (no system-lib prefix)")
    blob = tvm.get_global_func("runtime.ModulePackImportsToTensor")(module)
    symbol = str(tvm.get_global_func("runtime.ModuleImportsBlobName")())
    blob_path = os.path.join(workspace_dir, "aotc_imports.bin")
    data = np.from_dlpack(blob)
    data.tofile(blob_path)
    section = ".lrodata" if data.size > _LARGE_DATA else ".rodata"
    asm_path = os.path.join(workspace_dir, "aotc_imports.s")
    with open(asm_path, "w", encoding="ascii") as f:
        f.write(incbin_source(symbol, blob_path, section))
    return asm_path


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
