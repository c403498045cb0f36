"""A .pt2 whose loading would unpickle something (legacy weights, a payload marked use_pickle,
an opaque constant, sample inputs that weights_only refuses, an AOTInductor library) is
refused before torch reads it, with an error naming the member; ``trust_pickle`` loads it.
Before this check torch.export.load ran the pickles (a command ran in aotc compile)."""

import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import aotc
from aotc.cli import main
from aotc.errors import ModelLoadError


class _RunsCommand:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _touch_then(marker, value):
    open(marker, "w").close()
    return value


class _MarksThenGives:
    """Unpickles (weights_only=False only) into ``value``, touching ``marker`` on the way."""
    def __init__(self, marker, value):
        self.marker, self.value = str(marker), value

    def __reduce__(self):
        return _touch_then, (self.marker, self.value)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x)) + torch.tensor([1.0, 2.0, 3.0])


def _saved(tmp_path):
    torch.manual_seed(0)
    net, x = _Net().eval(), torch.randn(2, 4)
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net, (x,)), path)
    return path, net, x


def _rewrite(path, edit):
    """The archive with ``edit(members)`` applied: a dict of name (below the root) -> bytes."""
    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/")[0]
        members = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    edit(members)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(f"{root}/{name}", data)


def _torch_saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _opaque_constant(members, marker):
    config = json.loads(members["data/constants/model_constants_config.json"])
    entry = next(iter(config["config"].values()))
    entry["path_name"] = "opaque_obj_0"
    members["data/constants/model_constants_config.json"] = json.dumps(config).encode()
    members["data/constants/opaque_obj_0"] = pickle.dumps(_RunsCommand(marker))


CRAFTS = {
    "legacy-weights": (lambda m, marker: m.__setitem__("data/weights/model.pt",
                                                       _torch_saved(_RunsCommand(marker))),
                       "data/weights/model.pt"),
    "use-pickle": (lambda m, marker: _pickled_weight(m, _RunsCommand(marker)), "weight_0"),
    "opaque-constant": (_opaque_constant, "opaque_obj_0"),
    "sample-inputs": (lambda m, marker: m.__setitem__("data/sample_inputs/model.pt",
                                                      _torch_saved((_RunsCommand(marker),))),
                      "data/sample_inputs/model.pt"),
    "aoti": (lambda m, marker: m.__setitem__("data/aotinductor/model/model.so", b"\x7fELF"),
             "AOTInductor"),
}


@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_an_archive_that_would_unpickle_is_refused_by_member(craft, tmp_path):
    path, _, _ = _saved(tmp_path)
    edit, named = CRAFTS[craft]
    marker = tmp_path / "ran"
    _rewrite(path, lambda members: edit(members, marker))
    with pytest.raises(ModelLoadError, match="refused") as err:
        aotc.compile(path, output=tmp_path / "net.so")
    assert named in str(err.value) and "--trust-pickle" in str(err.value)
    assert not marker.exists()


def _pickled_weight(members, value):
    config = json.loads(members["data/weights/model_weights_config.json"])
    entry = config["config"]["fc.weight"]
    entry["use_pickle"] = True
    members["data/weights/model_weights_config.json"] = json.dumps(config).encode()
    members[f"data/weights/{entry['path_name']}"] = _torch_saved(value)


def test_the_cli_refuses_it_in_one_line_and_trust_pickle_loads_it(tmp_path):
    path, net, x = _saved(tmp_path)
    marker = tmp_path / "ran"
    weight = torch.nn.Parameter(net.fc.weight.detach().clone())
    _rewrite(path, lambda members: _pickled_weight(members, _MarksThenGives(marker, weight)))
    out = tmp_path / "net.so"
    refused = CliRunner().invoke(main, ["compile", str(path), "-o", str(out)])
    assert refused.exit_code == 1 and "refused" in refused.output and not marker.exists()
    # trusted: torch unpickles the weight (running the reducer), and the model compiles
    trusted = CliRunner().invoke(main, ["compile", str(path), "-o", str(out), "--trust-pickle"])
    assert trusted.exit_code == 0, trusted.output
    assert marker.exists()
    got = next(iter(aotc.load(out)(x.numpy()).values()))
    with torch.no_grad():
        np.testing.assert_allclose(got, net(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_plain_torch_export_save_still_loads(tmp_path):
    path, net, x = _saved(tmp_path)
    aotc.compile(path, output=tmp_path / "net.so")
    got = next(iter(aotc.load(tmp_path / "net.so")(x.numpy()).values()))
    with torch.no_grad():
        np.testing.assert_allclose(got, net(x).numpy(), rtol=1e-5, atol=1e-6)


def test_an_archive_from_before_torch_2_7_is_refused(tmp_path):
    path = tmp_path / "old.pt2"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("version", "8.0")
        archive.writestr("serialized_exported_program.json", "{}")
        archive.writestr("serialized_state_dict.pt", pickle.dumps({}))
    path.write_bytes(buffer.getvalue())
    with pytest.raises(ModelLoadError, match="older than torch 2.7"):
        aotc.compile(path, output=tmp_path / "old.so")
