"""The RL search's policy: which decision of a trace to change, and to what.

Two softmax tables, learned by REINFORCE (policy gradient with a moving-average baseline and
an entropy bonus):
- 'which': one logit per decision key (kind and ordinal, decisions.Decision.which_key); a
  trace's decisions compete through a softmax over their logits;
- 'move': one logit vector per move key (tile slot pairs for a tile of n slots, candidate
  indices for a categorical), masked to the moves valid on the current value.
Keys are shared by kernels of one family, so one policy object serves every task of a tuning
run (carried from task to task) and can be saved with the log and loaded by the next run."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field

import numpy as np

from .decisions import Decision


@dataclass
class Step:
    """One sampled action, enough to compute its log-probability gradient later."""
    which_keys: tuple[str, ...]
    which_index: int
    move_key: str
    move_mask: tuple[bool, ...]
    move_index: int


@dataclass
class Policy:
    learning_rate: float = 0.1
    entropy_weight: float = 0.01
    baseline_decay: float = 0.9
    which: dict[str, float] = field(default_factory=dict)
    move: dict[str, list[float]] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)  # per reward source
    updates: int = 0

    def sample(self, options: list[Decision], rng: random.Random) -> tuple[Decision, tuple, Step]:
        """Pick a decision with a valid move, then the move; None when no move is valid."""
        movable = [d for d in options if any(d.valid(m) for m in d.moves())]
        if not movable:
            return None
        keys = tuple(d.which_key for d in movable)
        which_index = _draw(_softmax(np.array([self.which.get(k, 0.0) for k in keys])), rng)
        decision = movable[which_index]
        moves = decision.moves()
        mask = tuple(decision.valid(m) for m in moves)
        probs = _softmax(self._move_logits(decision.move_key, len(moves)), mask)
        move_index = _draw(probs, rng)
        return decision, moves[move_index], Step(keys, which_index, decision.move_key, mask,
                                                 move_index)

    def reinforce(self, episodes: list[tuple[list[Step], float]], source: str) -> None:
        """One policy-gradient step: each episode's steps pushed by (reward - baseline)."""
        if not episodes:
            return
        baseline = self.baseline.get(source, float(np.mean([r for _, r in episodes])))
        for steps, reward in episodes:
            advantage = reward - baseline
            for step in steps:
                self._push_which(step, advantage)
                self._push_move(step, advantage)
        mean = float(np.mean([r for _, r in episodes]))
        self.baseline[source] = self.baseline_decay * baseline + (1 - self.baseline_decay) * mean
        self.updates += 1

    def _push_which(self, step: Step, advantage: float) -> None:
        logits = np.array([self.which.get(k, 0.0) for k in step.which_keys])
        grad = _policy_gradient(logits, None, step.which_index, advantage, self.entropy_weight)
        for key, g in zip(step.which_keys, grad):
            self.which[key] = self.which.get(key, 0.0) + self.learning_rate * float(g)

    def _push_move(self, step: Step, advantage: float) -> None:
        logits = self._move_logits(step.move_key, len(step.move_mask))
        grad = _policy_gradient(logits, step.move_mask, step.move_index, advantage,
                                self.entropy_weight)
        self.move[step.move_key] = list(logits + self.learning_rate * grad)

    def _move_logits(self, key: str, size: int) -> np.ndarray:
        return np.array(self.move.get(key, [0.0] * size), dtype=np.float64)

    def to_json(self) -> str:
        return json.dumps({"which": self.which, "move": self.move, "baseline": self.baseline,
                           "updates": self.updates})

    @classmethod
    def from_json(cls, text: str) -> Policy:
        data = json.loads(text)
        return cls(which=data["which"], move=data["move"], baseline=data["baseline"],
                   updates=data["updates"])


def _softmax(logits: np.ndarray, mask=None) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    if mask is not None:
        shifted = shifted * np.array(mask, dtype=np.float64)
    return shifted / shifted.sum()


def _draw(probs: np.ndarray, rng: random.Random) -> int:
    return min(int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum())),
               len(probs) - 1)


def _policy_gradient(logits, mask, chosen, advantage, entropy_weight) -> np.ndarray:
    """d/dlogits of advantage * log p(chosen) + entropy_weight * H(p), over valid entries."""
    probs = _softmax(logits, mask)
    onehot = np.zeros_like(probs)
    onehot[chosen] = 1.0
    valid = probs > 0
    log_probs = np.where(valid, np.log(np.where(valid, probs, 1.0)), 0.0)
    entropy = -float((probs * log_probs).sum())
    entropy_grad = -probs * (log_probs + entropy)
    grad = advantage * (onehot - probs) + entropy_weight * entropy_grad
    return np.where(valid, grad, 0.0)


def clipped_log_ratio(before: float, after: float, bound: float = 2.0) -> float:
    """Reward of a change: log of the speed-up (before/after time, or after/before score),
    clipped so that one outlier cannot swamp an update."""
    if before <= 0 or after <= 0:
        return -bound
    return max(-bound, min(bound, math.log(before / after)))


def model_reward(score: float, start_score: float, trust: float) -> float:
    """Inner reward of an edit: the cost model's predicted speed-up over its start (scores:
    higher is faster), scaled by how far the model is trusted. Positive when the model
    predicts the edit faster (tests/test_search_rl.py checks the sign)."""
    return trust * clipped_log_ratio(score, start_score)
