"""The cost-model state kept beside a tuning log cannot run code: it round-trips as plain
arrays and XGBoost's UBJSON, a pickle inside it is refused, and an old-format ``.xgb``
(MetaSchedule's tar with a pickled array) is never opened."""

import logging
import os
import tarfile

import numpy as np
import pytest
import xgboost as xgb
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

from aotc.schedules import warm_state


class _RunsCommand:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _trained_model() -> ms.cost_model.XGBModel:
    rng = np.random.default_rng(0)
    model = ms.cost_model.XGBModel(num_warmup_samples=1)
    groups = {}
    for name, count in (("g1", 3), ("g2", 2)):
        features = [rng.random((int(rng.integers(1, 4)), 164), dtype=np.float32)
                    for _ in range(count)]
        groups[name] = FeatureGroup(name, features, rng.random(count).astype(np.float32))
    rows = np.concatenate([f for g in groups.values() for f in g.features])
    model.data, model.data_size = groups, 5
    model.booster = xgb.train({"max_depth": 2}, xgb.DMatrix(rows, label=rng.random(len(rows))),
                              num_boost_round=3)
    return model


def test_state_round_trips_as_plain_arrays(tmp_path):
    log = tmp_path / "log.jsonl"
    saved = _trained_model()
    warm_state.save(saved, None, log)
    state_path = warm_state.paths(log)[0]
    assert state_path.name == "log.jsonl.costmodel.npz"
    with np.load(state_path, allow_pickle=False) as npz:  # nothing in it needs pickle
        assert {npz[name].dtype.kind for name in npz.files} <= {"u", "U", "i", "f"}
    loaded = ms.cost_model.XGBModel(num_warmup_samples=1)
    assert warm_state.load(loaded, log) == (None, 5)
    assert list(loaded.data) == ["g1", "g2"]
    for name, group in saved.data.items():
        assert all(np.array_equal(a, b) for a, b in zip(group.features, loaded.data[name].features))
        np.testing.assert_array_equal(group.costs, loaded.data[name].costs)
    probe = xgb.DMatrix(saved.data["g1"].features[0])
    np.testing.assert_array_equal(saved.booster.predict(probe), loaded.booster.predict(probe))


def test_a_pickle_in_the_state_is_refused_and_not_run(tmp_path, caplog):
    log, marker = tmp_path / "log.jsonl", tmp_path / "ran"
    state_path = warm_state.paths(log)[0]
    with open(state_path, "wb") as f:
        np.savez(f, booster=np.zeros(4, np.uint8), group_hashes=np.array(["g"]),
                 group_sizes=np.array([1]), rows=np.array([1]),
                 features=np.array([_RunsCommand(marker)], dtype=object),
                 costs=np.array([1.0], np.float32))
    model = ms.cost_model.XGBModel(num_warmup_samples=1)
    with caplog.at_level(logging.WARNING, logger="aotc.tuning"):
        assert warm_state.load(model, log) == (None, 0)
    assert not marker.exists()
    assert model.booster is None and "cost model not loaded" in caplog.text


def test_an_old_xgb_state_is_never_opened(tmp_path, caplog):
    """MetaSchedule's XGBModel.load untars and unpickles this: a command ran in aotc tune."""
    log, marker = tmp_path / "log.jsonl", tmp_path / "ran"
    np.save(tmp_path / "data.npy", np.array([_RunsCommand(marker)], dtype=object),
            allow_pickle=True)
    with tarfile.open(tmp_path / "log.jsonl.xgb", "w") as tar:
        tar.add(tmp_path / "data.npy", arcname="data.npy")
    model = ms.cost_model.XGBModel(num_warmup_samples=1)
    with caplog.at_level(logging.WARNING, logger="aotc.tuning"):
        assert warm_state.load(model, log) == (None, 0)
    assert not marker.exists()
    assert "log.jsonl.xgb: ignored" in caplog.text


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04garbage"])
def test_a_damaged_state_starts_cold(tmp_path, caplog, content):
    log = tmp_path / "log.jsonl"
    warm_state.paths(log)[0].write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="aotc.tuning"):
        assert warm_state.load(ms.cost_model.XGBModel(), log) == (None, 0)
    assert "starting cold" in caplog.text
