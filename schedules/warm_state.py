"""What a tuning run learns beyond its records, kept beside its log for the next run: the
cost model (XGBoost booster plus the features and times it was trained on) and the RL
search's policy.

``<log>.xgb`` and ``<log>.policy.json``. A run on the same log (a resumed run, or another
model of the same target tuned into it) starts from both instead of from scratch; the
cost model's features are per store, not per kernel, so measurements of other kernels still
rank new ones. Written atomically (temporary file, then rename), so that a killed run leaves
the previous state intact."""

from __future__ import annotations

import logging
import os
import tarfile
from pathlib import Path

from .search.policy import Policy

LOG = logging.getLogger("aotc.tuning")


def paths(log_path) -> tuple[Path, Path]:
    log_path = Path(log_path)
    return (log_path.with_name(log_path.name + ".xgb"),
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
    if model_path.is_file():
        try:
            cost_model.load(str(model_path))
        except (OSError, ValueError, tarfile.TarError, NameError) as err:
            # NameError: MetaSchedule's XGBModel.load on a state saved before it had trained
            LOG.warning("%s: cost model not loaded (%s); starting cold", model_path, err)
    return policy, int(getattr(cost_model, "data_size", 0))


def save(cost_model, policy: Policy | None, log_path) -> None:
    model_path, policy_path = paths(log_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    if getattr(cost_model, "booster", None) is not None:
        _atomic(model_path, lambda tmp: cost_model.save(str(tmp)))
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
