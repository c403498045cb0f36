"""Outputs are written whole or not at all (aotc/atomic.py): a compile that fails while its
library is being put in place leaves the previous file intact and no stray temporary file
(``shutil.move`` across filesystems was a copy then a delete: a kill mid-copy left a truncated
.so and lost the good one)."""

import shutil

import pytest

import aotc
from aotc import atomic


def test_a_failed_copy_keeps_the_previous_file(tmp_path, monkeypatch):
    dest, src = tmp_path / "out" / "model.so", tmp_path / "new.so"
    dest.parent.mkdir()
    dest.write_bytes(b"previous good library")
    src.write_bytes(b"x" * 1_000_000)

    def half_then_die(a, b):
        with open(b, "wb") as f:
            f.write(b"x" * 1000)
        raise KeyboardInterrupt  # as a kill would stop it mid-copy

    monkeypatch.setattr(shutil, "copyfile", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        atomic.copy_into_place(src, dest)
    assert dest.read_bytes() == b"previous good library"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.so"]


def test_a_copy_replaces_the_file_whole(tmp_path):
    dest, src = tmp_path / "model.so", tmp_path / "src" / "new.so"
    src.parent.mkdir()
    src.write_bytes(b"new")
    src.chmod(0o755)
    dest.write_bytes(b"old")
    atomic.copy_into_place(src, dest)
    assert dest.read_bytes() == b"new" and dest.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.so", "src"]


def test_a_compile_that_fails_at_export_keeps_the_previous_model(tiny_onnx, tiny_so, tmp_path,
                                                                  monkeypatch):
    out = tmp_path / "model.so"
    shutil.copy(tiny_so, out)
    before = out.read_bytes()

    def fail(*_args):
        raise OSError("disk full")

    # the library is linked into a temporary file beside the output; fail after that
    from aotc.runtime import artifact
    monkeypatch.setattr(artifact, "seal", fail)
    with pytest.raises(Exception, match="disk full"):
        aotc.compile(tiny_onnx, output=out)
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.so"]
    assert aotc.load(out) is not None
