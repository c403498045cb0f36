"""The sampled decisions of a schedule trace, and the moves the RL policy can make on them.

A trace from MetaSchedule's space (or the default rules' space) records one decision per
sampling instruction. Two kinds are moved here:
- ``SamplePerfectTile``: a loop's tile sizes. A move takes one prime factor from slot ``src``
  to slot ``dst`` (the product stays the loop extent, so the tiling stays perfect); a move that
  would push the innermost tile past the instruction's maximum is masked out.
- ``SampleCategorical``: an index into the instruction's candidates (unroll depth; the default
  rules' register tile). A move picks another index.
Compute locations (``SampleComputeLocation``) are not moved here: which loops are valid
depends on the schedule state. The space's own mutators (MetaSchedule's MutateComputeLocation,
MutateParallel, MutateUnroll, MutateTileSize: the moves its evolutionary search makes) are
offered to the policy as actions of their own (``MutatorEdit``), so the RL search's
neighbourhood holds every move the baseline's does."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tvm.s_tir.meta_schedule import _ffi_api as ms_ffi
from tvm.s_tir.schedule import Trace

TILE, CATEGORICAL = "SamplePerfectTile", "SampleCategorical"


@dataclass(frozen=True)
class Decision:
    inst: object        # the trace's Instruction
    kind: str           # TILE or CATEGORICAL
    ordinal: int        # its position among the trace's decisions of the same kind
    value: tuple        # tile sizes, or (chosen index,)
    choices: tuple      # tile: (slots, max innermost); categorical: the candidate values

    @property
    def which_key(self) -> str:
        """Key of this decision in the policy's 'which decision' table: kind and ordinal
        carry from kernel to kernel (MetaSchedule tiles loops in the same order in every
        contraction), names and extents would not."""
        return f"{self.kind}#{self.ordinal}"

    @property
    def move_key(self) -> str:
        if self.kind == TILE:
            return f"{TILE}/{len(self.value)}"
        return f"{CATEGORICAL}/{','.join(str(c) for c in self.choices)}"

    def moves(self) -> list[tuple]:
        """Every move, valid or not, in a fixed order (the policy's action indices)."""
        if self.kind == TILE:
            n = len(self.value)
            return [(src, dst) for src in range(n) for dst in range(n) if src != dst]
        return [(index,) for index in range(len(self.choices))]

    def valid(self, move: tuple) -> bool:
        if self.kind == CATEGORICAL:
            return move[0] != self.value[0]
        src, dst = move
        if self.value[src] == 1:
            return False
        max_innermost = self.choices[1]
        smallest = _primes(self.value[src])[0]
        last = len(self.value) - 1
        return not (dst == last and max_innermost > 0
                    and self.value[dst] * smallest > max_innermost)

    def apply(self, trace: Trace, move: tuple, rng: random.Random) -> Trace:
        if self.kind == CATEGORICAL:
            return trace.with_decision(self.inst, move[0], remove_postproc=True)
        src, dst = move
        tiles = list(self.value)
        primes = _primes(tiles[src])
        if dst == len(tiles) - 1 and self.choices[1] > 0:
            primes = [p for p in primes if tiles[dst] * p <= self.choices[1]]
        prime = rng.choice(primes)
        tiles[src] //= prime
        tiles[dst] *= prime
        return trace.with_decision(self.inst, tiles, remove_postproc=True)


@dataclass(frozen=True)
class MutatorEdit:
    """One of the space's mutators as a policy action: a single move, which may fail (the
    mutator finds nothing to change in this trace); ``apply`` then returns None."""
    mutator: object
    name: str

    @property
    def which_key(self) -> str:
        return f"Mutator/{self.name}"

    move_key = "Mutator"

    def moves(self) -> list[tuple]:
        return [()]

    def valid(self, move: tuple) -> bool:
        return True

    def apply(self, trace: Trace, move: tuple, rng: random.Random) -> Trace | None:
        return ms_ffi.MutatorApply(self.mutator, trace, rng.randint(1, 2**31 - 1))


def mutator_edits(mutators) -> list[MutatorEdit]:
    """The space generator's mutators (a TuneContext initialised them) as policy actions."""
    return [MutatorEdit(m, type(m).__name__) for m in mutators]


def decisions(trace: Trace) -> list[Decision]:
    found, seen = [], {TILE: 0, CATEGORICAL: 0}
    for inst in trace.insts:
        kind = inst.kind.name
        if kind not in seen:
            continue
        value = trace.get_decision(inst)
        if value is None:
            continue
        if kind == TILE:
            value, choices = tuple(int(v) for v in value), (len(value), int(inst.attrs[1]))
        else:
            value, choices = (int(value),), tuple(int(c) for c in inst.attrs[0])
            if len(choices) < 2:
                continue
        found.append(Decision(inst, kind, seen[kind], value, choices))
        seen[kind] += 1
    return found


def _primes(n: int) -> list[int]:
    """Distinct prime factors of n (n >= 2)."""
    out, p = [], 2
    while p * p <= n:
        if n % p == 0:
            out.append(p)
            while n % p == 0:
                n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out
