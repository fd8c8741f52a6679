"""Envs whose observations echo the action they were given, for every kind of action space
(importable, so that spawned workers find them): a vec env that hands an env another action
than the one meant for it shows it in the next observation."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ACTION_KINDS = ("dict", "tuple", "pair", "nested", "box", "discrete", "multidiscrete")


def make_action_space(kind: str) -> spaces.Space:
    if kind == "dict":
        return spaces.Dict({
            "move": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            "fire": spaces.Discrete(3),
            "gear": spaces.MultiDiscrete([2, 4]),
        })
    if kind == "tuple":
        return spaces.Tuple((spaces.Discrete(4), spaces.Box(-2.0, 2.0, shape=(3,), dtype=np.float32)))
    if kind == "pair":  # as many subspaces as the tests have envs in some cases: (Discrete, Discrete)
        return spaces.Tuple((spaces.Discrete(5), spaces.Discrete(5)))
    if kind == "nested":
        return spaces.Dict({
            "arm": spaces.Tuple((spaces.Discrete(3), spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32))),
            "grip": spaces.MultiBinary(2),
        })
    if kind == "box":
        return spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    if kind == "discrete":
        return spaces.Discrete(6)
    if kind == "multidiscrete":
        return spaces.MultiDiscrete([3, 5])
    raise ValueError(f"unknown action kind {kind!r}")


def sample_action(space: spaces.Space, rng: np.random.Generator) -> Any:
    """One env's action, as a user's loop would write it: Python ints for Discrete, arrays otherwise."""
    if isinstance(space, spaces.Dict):
        return {key: sample_action(sub, rng) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample_action(sub, rng) for sub in space.spaces)
    if isinstance(space, spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        return rng.integers(space.nvec)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, size=space.shape).astype(np.int8)
    return rng.uniform(space.low, space.high).astype(space.dtype)


class EchoActionEnv(gym.Env):
    """Observation: the flattened action it was given, then noise; reward: a function of both;
    ends at random and after ``limit`` steps."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, kind: str = "dict", limit: int = 9, render_mode: str | None = None) -> None:
        self.kind = kind
        self.limit = limit
        self.render_mode = render_mode
        self.action_space = make_action_space(kind)
        self.size = int(spaces.flatdim(self.action_space))
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(self.size + 2,), dtype=np.float32)
        self.t = 0

    def _obs(self, flat: np.ndarray) -> np.ndarray:
        return np.concatenate([flat, self.np_random.normal(size=2)]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(np.zeros(self.size)), {}

    def step(self, action):
        assert self.action_space.contains(action), (self.kind, action)
        self.t += 1
        flat = spaces.flatten(self.action_space, action).astype(np.float64)
        weights = np.arange(1, self.size + 1)
        reward = float(flat @ weights) + float(self.np_random.normal())
        terminated = bool(self.np_random.random() < 0.1)
        return self._obs(flat), reward, terminated, self.t >= self.limit, {"seen": flat.tolist()}


def make_echo_env(kind: str = "dict", limit: int = 9) -> gym.Env:
    return EchoActionEnv(kind, limit)
