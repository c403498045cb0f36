"""The run-by-run choice between TVM's pool and one thread (runtime/parallelism.py), driven by
a fake clock: the pool is kept while it is faster, left when other work makes it slower than
one thread, and tried again (for 3 runs) only once the other cores have been idle; failed
tries back off. The real effect is measured in bench/contention.py."""

import pytest

from aotc.runtime import parallelism
from aotc.runtime.parallelism import INLINE, POOL, Parallelism


class FakeMachine:
    """Run times by mode (pool when TVM's concurrency is not capped at 1), on a fake clock."""

    def __init__(self, pool_ms: float, inline_ms: float, idle: bool = False):
        self.pool_ms, self.inline_ms, self.idle = pool_ms, inline_ms, idle
        self.now, self.capped, self.modes = 0.0, False, []

    def set_max(self, value: int) -> None:
        self.capped = value == 1

    def work(self):
        self.modes.append(INLINE if self.capped else POOL)
        self.now += (self.inline_ms if self.capped else self.pool_ms) / 1e3


@pytest.fixture
def machine(monkeypatch):
    fake = FakeMachine(2.0, 4.0)
    monkeypatch.setattr(parallelism, "_set_max_concurrency", lambda: fake.set_max)
    monkeypatch.setattr(parallelism.IdleCores, "mostly_idle", lambda _self: fake.idle)
    return fake


def _runs(machine, count: int, policy: str = "adaptive") -> Parallelism:
    choice = Parallelism(2, policy, clock=lambda: machine.now)
    for _ in range(count):
        choice.run(machine.work)
    return choice


def test_an_idle_machine_keeps_the_pool_after_one_inline_probe(machine):
    choice = _runs(machine, 50)
    assert choice.mode == POOL and machine.modes.count(INLINE) == 1
    assert machine.modes[3] == INLINE  # the probe, once the pool is warm


def test_a_busy_machine_leaves_the_pool_and_does_not_try_it_while_busy(machine):
    machine.pool_ms = 80.0  # a neighbour holds a pinned worker's core
    choice = _runs(machine, 200)
    assert choice.mode == INLINE
    assert machine.modes[4:].count(POOL) <= 1 and machine.modes[-100:] == [INLINE] * 100


def test_the_pool_comes_back_when_the_cores_free_up(machine):
    machine.pool_ms = 80.0
    choice = Parallelism(2, clock=lambda: machine.now)
    for _ in range(20):
        choice.run(machine.work)
    assert choice.mode == INLINE
    machine.pool_ms, machine.idle = 2.0, True  # the neighbour left
    for _ in range(20):
        choice.run(machine.work)
    assert choice.mode == POOL and machine.modes[-5:] == [POOL] * 5


def test_failed_tries_back_off(machine):
    machine.pool_ms, machine.idle = 80.0, True  # idle by /proc/stat, yet the pool is slow
    choice = _runs(machine, 400)
    assert choice.mode == INLINE and choice.wait >= 64 and choice.pause >= 1.0
    assert machine.modes[100:].count(POOL) <= 3 * 3  # a few 3-run tries in 300 runs


def test_a_model_whose_pool_never_wins_tries_it_seldom(machine):
    """A 50 us model: the pool's handoff alone costs more than the run. Each try wakes TVM's
    workers, which then spin for a long time: tries are spaced in seconds, not only in runs
    (every 256 runs was every 13 ms here)."""
    machine.pool_ms, machine.inline_ms, machine.idle = 0.2, 0.05, True
    choice = _runs(machine, 200_000)  # 10 s
    assert choice.mode == INLINE and machine.now > 10
    tries = sum(1 for before, now in zip(machine.modes, machine.modes[1:])
                if before == INLINE and now == POOL)
    assert tries <= 7  # pauses of 0.25, 0.5, 1, 2, 4 and 8 s


def test_runs_of_many_sizes_keep_the_pool_on_an_idle_machine(machine):
    """A server's requests come in sizes: a batch of 8 in the pool (8 ms) is slower than a
    single request inline (4 ms) with no contention at all. Times compare within a size."""
    choice = Parallelism(2, clock=lambda: machine.now)
    for k in range(120):
        rows = (1, 2, 4, 8)[k % 4]
        machine.pool_ms, machine.inline_ms = 2.0 * rows, 4.0 * rows
        choice.run(machine.work, size=("main", (rows, 64)))
    assert choice.mode == POOL and machine.modes.count(INLINE) == 4  # one probe per size


def test_contention_is_seen_within_each_size(machine):
    choice = Parallelism(2, clock=lambda: machine.now)
    for k in range(60):
        rows = (1, 8)[k % 2]
        machine.pool_ms, machine.inline_ms = 80.0 * rows, 4.0 * rows  # a busy neighbour
        choice.run(machine.work, size=rows)
    assert choice.mode == INLINE and machine.modes[-20:] == [INLINE] * 20


@pytest.mark.parametrize("policy, mode", [("pool", POOL), ("inline", INLINE)])
def test_a_fixed_policy_never_switches(policy, mode, machine):
    machine.pool_ms = 80.0 if policy == "pool" else 1.0
    _runs(machine, 30, policy)
    assert set(machine.modes) == {mode}


def test_proc_stat_is_read_at_most_every_look_interval(monkeypatch):
    """Reading /proc/stat costs more than a small model's run: in inline mode the idle check
    runs every run once the wait is over, and must not read the file each time."""
    now = [0.0]
    reads = []
    monkeypatch.setattr(parallelism.IdleCores, "_read",
                        lambda self: reads.append(now[0]) or {0: (0, 0), 1: (0, 0)})
    idle = parallelism.IdleCores(clock=lambda: now[0])
    idle.cores = [0, 1]
    for _ in range(1000):  # 1000 runs of 10 us
        idle.mostly_idle()
        now[0] += 1e-5
    assert len(reads) == 1  # the first look, at start
    now[0] += parallelism._LOOK_SECONDS
    idle.mostly_idle()
    assert len(reads) == 2


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="AOTC_PARALLELISM"):
        Parallelism(2, "sometimes")


def test_the_cgroup_cpu_quota_is_read_in_both_versions(tmp_path):
    from aotc.settings import cgroup_cpu_quota
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job\n2:cpu,cpuacct:/job\n0::/\n")
    v1 = tmp_path / "cpu,cpuacct" / "job"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(str(proc), str(tmp_path)) == 1.5
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(str(proc), str(tmp_path)) is None
    proc.write_text("0::/job2\n")
    (tmp_path / "job2").mkdir()
    (tmp_path / "job2" / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_quota(str(proc), str(tmp_path)) == 0.5
    (tmp_path / "job2" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(str(proc), str(tmp_path)) is None
