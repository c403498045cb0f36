"""Shipped tuning logs (tuning_logs/<example>.jsonl) must match the kernels compile produces
today: a pass change that renames nothing but changes a kernel changes its workload key, and
the log would then silently stop applying. Each record of a shipped log must name a kernel of
its example model, and at least one must still be applied (beat the default rules); this
host's records must have been timed against the default rules compile uses today."""

from pathlib import Path

import pytest
import tvm

import aotc.tuning_logs
from aotc.api import tuning_tasks
from aotc.examples import models
from aotc.examples.export_onnx import export
from aotc.schedules import log as tuning_log
from aotc.schedules.keys import schedule_key, target_key
from aotc.targets import all_targets

SHIPPED = sorted(Path(aotc.tuning_logs.__file__).parent.glob("*.jsonl"))


def test_logs_are_shipped_for_the_examples():
    assert {p.stem for p in SHIPPED} == set(models.EXAMPLES)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_log_matches_the_kernels_compile_produces(path, example_onnx_dir):
    """Tuned from the ONNX export, as users compile the examples (the torch frontend makes
    other kernels of the BERT encoder)."""
    records, warnings = tuning_log.read(path)
    assert warnings == [], warnings
    onnx_path = export(path.stem, example_onnx_dir)
    tasks, target, default = tuning_tasks(onnx_path)
    finals = [r for r in records if r.final]
    # each record against the kernels compile makes for its own target (the packed kernels'
    # shapes follow the vector width, so an AVX2 host's keys differ from an AVX-512 one's)
    keys_for = {target_key(target): {t.key for t in tasks}}
    for key in {r.target for r in finals} - set(keys_for):
        preset = next((s.name for s in all_targets() if s.name != "x86" and
                       target_key(tvm.target.Target(s.tvm_target)) == key), None)
        assert preset is not None, f"{path.name}: no preset builds for {key}"
        keys_for[key] = {t.key for t in tuning_tasks(onnx_path, preset)[0]}
    stale = sorted(r.task for r in finals if r.workload not in keys_for[r.target])
    assert not stale, (f"{path.name}: records for kernels compile no longer produces: {stale}; "
                       "re-tune it (tuning_logs/README.md)")
    assert any(r.beats_default for r in finals)
    # this host's records were timed against today's default rules (compile skips them
    # otherwise, so they would silently stop applying)
    here = [r for r in finals if r.target == target_key(target) and r.default_schedule]
    funcs = {t.key: t.func for t in tasks}
    changed = sorted(r.task for r in here
                     if schedule_key(default(funcs[r.workload])) != r.default_schedule)
    assert not changed, (f"{path.name}: records timed against other default rules: "
                         f"{changed}; re-tune it (tuning_logs/README.md)")
