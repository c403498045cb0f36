"""What a tuning run learns beyond its records, kept beside its log for the next run: the
cost model (XGBoost booster plus the features and times it was trained on) and the RL
search's policy.

``<log>.costmodel.npz`` and ``<log>.policy.json``. A run on the same log (a resumed run, or
another model of the same target tuned into it) starts from both instead of from scratch; the
cost model's features are per store, not per kernel, so measurements of other kernels still
rank new ones. Written atomically (temporary file, then rename), so that a killed run leaves
the previous state intact.

The state is data a user may be handed, so it is kept in formats that cannot run code: the
booster as XGBoost's UBJSON bytes, the features and costs as plain arrays in an ``.npz`` read
with ``allow_pickle=False``. MetaSchedule's own ``XGBModel.save`` (a tar holding a pickled
object array, unpickled by ``load``) is never used; an ``<log>.xgb`` left by an older aotc is
ignored with a warning, never opened."""

from __future__ import annotations

import io
import logging
import os
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .search.policy import Policy

LOG = logging.getLogger("aotc.tuning")
_ARRAYS = ("booster", "group_hashes", "group_sizes", "rows", "features", "costs")


class StateError(Exception):
    """A cost-model state file that is not what ``save`` writes."""


def paths(log_path) -> tuple[Path, Path]:
    log_path = Path(log_path)
    return (log_path.with_name(log_path.name + ".costmodel.npz"),
            log_path.with_name(log_path.name + ".policy.json"))


def load(cost_model, log_path) -> tuple[Policy | None, int]:
    """(saved policy or None, measurements the cost model starts with)."""
    model_path, policy_path = paths(log_path)
    policy = None
    if policy_path.is_file():
        try:
            policy = Policy.from_json(policy_path.read_text())
        except (ValueError, KeyError) as err:
            LOG.warning("%s: not a policy (%s); starting a new one", policy_path, err)
    legacy = Path(log_path).with_name(Path(log_path).name + ".xgb")
    if legacy.exists():
        LOG.warning("%s: ignored (the old cost-model format holds a pickle, which can run code; "
                    "delete it: this run saves %s)", legacy, model_path.name)
    if model_path.is_file():
        try:
            _load_cost_model(cost_model, model_path)
        except (OSError, StateError) as err:
            LOG.warning("%s: cost model not loaded (%s); starting cold", model_path, err)
    return policy, int(getattr(cost_model, "data_size", 0))


def save(cost_model, policy: Policy | None, log_path) -> None:
    model_path, policy_path = paths(log_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    if getattr(cost_model, "booster", None) is not None:
        _atomic(model_path, lambda tmp: tmp.write_bytes(_cost_model_bytes(cost_model)))
    if policy is not None and policy.updates:
        _atomic(policy_path, lambda tmp: tmp.write_text(policy.to_json()))


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _cost_model_bytes(cost_model) -> bytes:
    """The booster and its training data as an .npz of plain arrays."""
    groups = list(cost_model.data.values())
    features = [np.asarray(f, dtype=np.float32) for g in groups for f in g.features]
    width = features[0].shape[1] if features else 0
    buffer = io.BytesIO()
    np.savez(buffer,
             booster=np.frombuffer(bytes(cost_model.booster.save_raw("ubj")), dtype=np.uint8),
             group_hashes=np.array([str(g.group_hash) for g in groups], dtype=np.str_),
             group_sizes=np.array([len(g.features) for g in groups], dtype=np.int64),
             rows=np.array([len(f) for f in features], dtype=np.int64),
             features=np.concatenate(features) if features else np.zeros((0, width), np.float32),
             costs=np.concatenate([np.asarray(g.costs, np.float32) for g in groups])
             if groups else np.zeros(0, np.float32))
    return buffer.getvalue()


def _load_cost_model(cost_model, path: Path) -> None:
    """Restore what _cost_model_bytes wrote into MetaSchedule's XGBModel; StateError when the
    file is anything else (nothing in it is unpickled or executed)."""
    import xgboost as xgb
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup
    arrays = _read_arrays(path)
    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(arrays["booster"].tobytes()))
    except xgb.core.XGBoostError as err:
        raise StateError(f"booster does not load: {str(err).splitlines()[0]}") from None
    per_candidate = np.split(arrays["features"], np.cumsum(arrays["rows"])[:-1]) \
        if len(arrays["rows"]) else []
    data, start = OrderedDict(), 0
    for group_hash, size in zip(arrays["group_hashes"], arrays["group_sizes"]):
        data[str(group_hash)] = FeatureGroup(str(group_hash), per_candidate[start:start + size],
                                             arrays["costs"][start:start + size].copy())
        start += int(size)
    cost_model.data, cost_model.data_size, cost_model.booster = data, start, booster


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            if sorted(npz.files) != sorted(_ARRAYS):
                raise StateError(f"holds {sorted(npz.files)}, expected {sorted(_ARRAYS)}")
            arrays = {name: npz[name] for name in _ARRAYS}
    except (ValueError, zipfile.BadZipFile, EOFError) as err:
        raise StateError(f"not a cost-model state ({err})") from None
    _check_shapes(arrays)
    return arrays


def _check_shapes(a: dict[str, np.ndarray]) -> None:
    kinds = {"booster": "u", "group_hashes": "U", "group_sizes": "i", "rows": "i",
             "features": "f", "costs": "f"}
    for name, kind in kinds.items():
        if a[name].dtype.kind != kind:
            raise StateError(f"{name} has dtype {a[name].dtype}")
    groups = len(a["group_hashes"])
    if (a["features"].ndim != 2 or a["rows"].ndim != 1 or a["costs"].ndim != 1
            or a["group_sizes"].shape != (groups,)
            or (a["group_sizes"] < 0).any() or (a["rows"] < 1).any()
            or int(a["group_sizes"].sum()) != len(a["rows"]) or len(a["rows"]) != len(a["costs"])
            or int(a["rows"].sum()) != len(a["features"])):
        raise StateError("array sizes do not agree")
