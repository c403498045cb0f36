"""The ELF objects compiler/packed_imports.py writes for a library's embedded bytes: linked by
the target's real toolchain, the symbol covers exactly the bytes given; the packed imports it
assembles are TVM's own bytes, for executables with no, one and several kernel libraries (the
libraries these make load and match onnxruntime: test_parallel_codegen.py, every model test)."""

import ctypes
import shutil
import subprocess

import numpy as np
import onnx
import pytest
import tvm
from onnx_builders import tiny_cnn

from aotc.compiler import parallel_codegen
from aotc.compiler.packed_imports import Chunks, packed_imports, write_blob, write_elf_object


def _link(cc: str, objects: list, out) -> None:
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), *map(str, objects)], check=True,
                   capture_output=True, text=True)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 4099])
def test_the_symbol_holds_the_bytes_in_a_linked_library(tmp_path, size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    obj = tmp_path / "blob.o"
    write_elf_object(str(obj), "aotc_test_blob", data, "x86_64")
    lib = tmp_path / "libblob.so"
    _link("cc", [obj], lib)
    loaded = ctypes.CDLL(str(lib))
    address = ctypes.addressof(ctypes.c_ubyte.in_dll(loaded, "aotc_test_blob"))
    assert bytes((ctypes.c_ubyte * size).from_address(address)) == data.tobytes()
    symbols = subprocess.run(["readelf", "-sW", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    line = next(s for s in symbols.splitlines() if s.endswith(" aotc_test_blob"))
    assert line.split()[2] == str(size) and "OBJECT" in line and "GLOBAL" in line


def test_the_stack_stays_non_executable_and_large_data_is_marked(tmp_path):
    obj = tmp_path / "large.o"
    write_elf_object(str(obj), "big", np.arange(100, dtype=np.uint8), "x86_64", large=True)
    sections = subprocess.run(["readelf", "-SW", str(obj)], capture_output=True, text=True,
                              check=True).stdout
    large = next(s for s in sections.splitlines() if ".lrodata" in s).split()
    assert large[large.index("PROGBITS") + 5] == "Al"  # alloc, x86-64 large (SHF_X86_64_LARGE)
    assert ".note.GNU-stack" in sections
    lib = tmp_path / "liblarge.so"
    _link("cc", [obj], lib)
    program = subprocess.run(["readelf", "-lW", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    stack = next(s for s in program.splitlines() if "GNU_STACK" in s)
    assert "RWE" not in stack


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="needs the aarch64 cross toolchain (gcc-aarch64-linux-gnu)")
def test_an_aarch64_object_links_with_the_cross_toolchain(tmp_path):
    data = bytes(range(256)) * 3
    path = write_blob(data, "aotc_test_blob", "aarch64", str(tmp_path), "blob")
    lib = tmp_path / "libblob.so"
    _link("aarch64-linux-gnu-gcc", [path], lib)
    header = subprocess.run(["readelf", "-hW", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    assert "AArch64" in header
    dump = subprocess.run(["aarch64-linux-gnu-objcopy", "-O", "binary", "--only-section=.rodata",
                           str(lib), str(tmp_path / "rodata.bin")], capture_output=True)
    assert dump.returncode == 0
    assert data in (tmp_path / "rodata.bin").read_bytes()


def test_other_machines_get_an_assembler_file_over_the_bytes(tmp_path):
    path = write_blob(b"abc", "aotc_test_blob", "riscv64", str(tmp_path), "blob")
    assert path.endswith(".s") and (tmp_path / "blob.bin").read_bytes() == b"abc"
    assert ".incbin" in open(path).read()


def _identity(path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "identity",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]),
              path)
    return path


@pytest.mark.parametrize("model, libraries", [("identity", 0), ("tiny_cnn", 1),
                                              ("tiny_cnn", 3)])
def test_packed_imports_are_tvm_s_own_bytes(tmp_path, monkeypatch, model, libraries):
    import importlib

    import aotc
    build = importlib.import_module("aotc.compiler.build")
    if model == "identity":
        path = _identity(tmp_path / "identity.onnx")
    else:
        path = tmp_path / "tiny_cnn.onnx"
        onnx.save(tiny_cnn(), path)
        monkeypatch.setattr(parallel_codegen, "MIN_KERNELS_PER_GROUP", 1)
        monkeypatch.setattr(parallel_codegen, "default_threads", lambda: libraries)
    seen = []
    real_export = build._export
    monkeypatch.setattr(build, "_export", lambda executable, *args: (
        seen.append(executable), real_export(executable, *args))[1])
    aotc.compile(path, output=tmp_path / "m.so")
    module = seen[0].mod
    kernel_libraries = [m for m in module.imports if m.is_compilation_exportable()]
    assert len(kernel_libraries) == 1   # the identity's library has no kernel in it
    assert sum(len(m.imports) for m in kernel_libraries) == max(libraries - 1, 0)
    want = np.from_dlpack(tvm.get_global_func("runtime.ModulePackImportsToTensor")(module))
    (tmp_path / "work").mkdir()
    chunks = packed_imports(module, str(tmp_path / "work"))
    assert chunks is not None and chunks.size == want.size
    with open(tmp_path / "got.bin", "wb") as f:
        chunks.write_to(f)
    assert (tmp_path / "got.bin").read_bytes() == want.tobytes()


def test_chunks_write_files_and_memory_in_order(tmp_path):
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    one.write_bytes(b"file one")
    two.write_bytes(bytes(range(256)) * 4099)
    chunks = Chunks([b"head", one, np.arange(5, dtype=np.uint8), two, b""])
    assert chunks.size == 4 + 8 + 5 + 256 * 4099
    with open(tmp_path / "out.bin", "wb") as f:
        f.write(b">")
        chunks.write_to(f)
        f.write(b"<")
    assert (tmp_path / "out.bin").read_bytes() == (
        b">head" + b"file one" + bytes(range(5)) + bytes(range(256)) * 4099 + b"<")
