import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def example_onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("example_onnx")


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory):
    """A small conv+relu+pool+gemm ONNX model, fast to compile, for CLI and runtime tests."""
    from onnx_builders import tiny_cnn
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    import onnx
    onnx.save(tiny_cnn(), path)
    return path


@pytest.fixture(scope="session")
def tiny_so(tiny_onnx, tmp_path_factory):
    import aotc
    out = tmp_path_factory.mktemp("tiny_so") / "tiny.so"
    aotc.compile(tiny_onnx, target="x86", output=out)
    return out


@pytest.fixture(scope="session")
def compiled_example(example_onnx_dir, tmp_path_factory):
    """``compiled_example(name)``: the example model ``name`` exported to ONNX and compiled
    for x86 with the default options, once per test process (the end-to-end and C++ runner
    tests check the same build; their tests share an xdist group, so one process builds it)."""
    import aotc
    from aotc.examples.export_onnx import export
    folder = tmp_path_factory.mktemp("compiled_examples")
    built: dict = {}

    def get(name: str):
        if name not in built:
            onnx_path = export(name, example_onnx_dir)
            so = folder / f"{name}.so"
            aotc.compile(onnx_path, target="x86", output=so)
            built[name] = (onnx_path, so)
        return built[name]
    return get


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "in_process: the test loads compiled models in its own process (tests of "
                   "the runtime's internals); every other test's models run in a process that "
                   "never loaded TVM's compiler (fresh_runner.py)")


@pytest.fixture(autouse=True)
def models_run_in_a_fresh_process(request, monkeypatch):
    if request.node.get_closest_marker("in_process"):
        return
    import fresh_runner

    import aotc.runtime
    monkeypatch.setattr(aotc.runtime, "load", fresh_runner.load)


# The order pytest-xdist deals work in (pyproject.toml passes --no-loadscope-reorder, so its
# queue follows the collection order set here). The two conformance suites run two processes
# of their own; the farm tests mostly wait on servers and timeouts. Started first, side by
# side, the waits overlap the suites' computing instead of leaving a core idle late in the run.
# Then the other xdist groups, largest first (as xdist's own reordering would), then the rest
# one by one in file order.
FIRST = ("tests/conformance/test_conformance.py::test_node_suite_has_no_regressions",
         "@test_farm", "tests/test_farm_daemons.py::",
         "tests/conformance/test_conformance.py::test_torch_sweep_sample_has_no_regressions")


def _group(item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return None if marker is None else (marker.args[0] if marker.args else
                                        marker.kwargs.get("name"))


def dealing_order(items: list) -> list:
    """``items`` in the order described above (stable within each part)."""
    sizes: dict[str, int] = {}
    for item in items:
        group = _group(item)
        if group is not None:
            sizes[group] = sizes.get(group, 0) + 1

    def key(indexed):
        index, item = indexed
        nodeid, group = item.nodeid, _group(item)
        for rank, pattern in enumerate(FIRST):
            if pattern.startswith("@") and group == pattern[1:] or pattern in nodeid:
                return (0, rank, index)
        if group is not None:
            return (1, -sizes[group], group, index)
        return (2, index)
    return [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    items[:] = dealing_order(items)
