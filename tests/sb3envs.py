"""Environments for the Stable-Baselines3 / sb3-contrib tests (and the examples).

Module level, so that ``spawn`` and ``forkserver`` workers can import them.  Each is
deterministic given its seed, so a ``ShmVecEnv`` and a ``DummyVecEnv`` built from the
same factories and seeds agree step for step.

- :class:`PointGoalEnv`: a goal-conditioned env with a ``Dict`` observation
  (``observation``, ``achieved_goal``, ``desired_goal``) and a vectorized
  ``compute_reward``, as ``HerReplayBuffer`` needs.
- :class:`MaskedEnv`: an env with ``action_masks()`` for ``MaskablePPO``; the mask
  changes every step, and a masked action is punished.
- :class:`FrameEnv`: 84x84 image observations (channels last) and ``rgb_array`` renders.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.monitor import Monitor


class PointGoalEnv(gym.Env):
    """Move a point in the plane towards a goal; sparse reward, as in gymnasium-robotics.

    The reward is 0 within ``tolerance`` of the goal and -1 elsewhere; ``compute_reward``
    takes batches (``achieved_goal`` of shape ``(batch, 2)``) and single goals alike.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, tolerance: float = 0.15, render_mode: str | None = None) -> None:
        box = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.observation_space = spaces.Dict({
            "observation": spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32),
            "achieved_goal": box,
            "desired_goal": box,
        })
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.tolerance = tolerance
        self.render_mode = render_mode
        self._pos = np.zeros(2, dtype=np.float32)
        self._goal = np.zeros(2, dtype=np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            "observation": np.concatenate([self._pos, self._goal - self._pos]).astype(np.float32),
            "achieved_goal": self._pos.copy(),
            "desired_goal": self._goal.copy(),
        }

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(distance > self.tolerance).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-0.5, 0.5, size=2).astype(np.float32)
        self._goal = self.np_random.uniform(-0.8, 0.8, size=2).astype(np.float32)
        return self._obs(), {}

    def step(self, action):
        move = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0) * 0.1
        self._pos = np.clip(self._pos + move, -1.0, 1.0).astype(np.float32)
        reward = float(self.compute_reward(self._pos, self._goal, None))
        terminated = reward == 0.0
        return self._obs(), reward, terminated, False, {"is_success": terminated}

    def render(self):
        frame = np.zeros((32, 32, 3), dtype=np.uint8)
        for point, channel in ((self._pos, 0), (self._goal, 1)):
            x, y = ((point + 1.0) * 15.5).astype(int)
            frame[y, x, channel] = 255
        return frame


def make_point_goal_env(max_steps: int = 20, render_mode: str | None = None) -> gym.Env:
    return TimeLimit(PointGoalEnv(render_mode=render_mode), max_episode_steps=max_steps)


class MaskedEnv(gym.Env):
    """``Discrete(n)`` (or ``MultiDiscrete``) actions of which a random subset is allowed each step.

    ``action_masks()`` returns the allowed actions of the current state (always at least one).
    A masked action costs -1, an allowed one earns +1 when it equals the state's "target".
    ``blocked`` (attribute) forbids one action for good: ``set_attr`` changes the masks.
    """

    def __init__(self, n: int = 5, multi: bool = False, index: int = 0) -> None:
        self.n = n
        self.multi = multi
        self.index = index
        self.observation_space = spaces.Box(0.0, 1.0, shape=(2 * n,), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete([n, 3]) if multi else spaces.Discrete(n)
        self.blocked: int | None = None
        self.mask_calls = 0
        self._mask = np.ones(n, dtype=bool)
        self._target = 0

    def _draw(self) -> np.ndarray:
        self._mask = self.np_random.random(self.n) < 0.6
        if self.blocked is not None:
            self._mask[self.blocked] = False
        if not self._mask.any():
            self._mask[0 if self.blocked != 0 else 1] = True
        allowed = np.flatnonzero(self._mask)
        self._target = int(allowed[self.np_random.integers(len(allowed))])
        onehot = np.zeros(self.n, dtype=np.float32)
        onehot[self._target] = 1.0
        return np.concatenate([self._mask.astype(np.float32), onehot])

    def action_masks(self) -> np.ndarray:
        self.mask_calls += 1
        if self.multi:
            return np.concatenate([self._mask, [True, True, False]])
        return self._mask.copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        a = int(np.asarray(action).reshape(-1)[0])
        reward = -1.0 if not self._mask[a] else (1.0 if a == self._target else 0.0)
        terminated = bool(self.np_random.random() < 0.1)
        return self._draw(), reward, terminated, False, {}


def make_masked_env(index: int = 0, n: int = 5, multi: bool = False, max_steps: int = 30) -> gym.Env:
    return Monitor(TimeLimit(MaskedEnv(n, multi, index), max_episode_steps=max_steps + index))


class DrawingMaskedEnv(MaskedEnv):
    """``action_masks()`` draws from ``np_random``: each call changes the rest of the episode."""

    def action_masks(self) -> np.ndarray:
        self.np_random.random()
        return super().action_masks()


def make_drawing_masked_env(index: int = 0) -> gym.Env:
    return TimeLimit(DrawingMaskedEnv(5, False, index), max_episode_steps=30 + index)


def masked_env_fns(n_envs: int, **kwargs: Any) -> list:
    return [functools.partial(make_masked_env, i, **kwargs) for i in range(n_envs)]


class FrameEnv(gym.Env):
    """84x84 frames (channels last, uint8): a bright square the agent moves left or right.

    The reward is +1 when the square is in the right half.  ``render()`` returns the frame
    as RGB.  Stands in for an Atari game where ale-py is not installed.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, channels: int = 1, render_mode: str | None = None) -> None:
        self.observation_space = spaces.Box(0, 255, shape=(84, 84, channels), dtype=np.uint8)
        self.action_space = spaces.Discrete(3)
        self.channels = channels
        self.render_mode = render_mode
        self._x = 42
        self._y = 42
        self._noise = np.zeros((84, 84, channels), dtype=np.uint8)

    def _frame(self) -> np.ndarray:
        frame = self._noise.copy()
        frame[self._y - 4:self._y + 4, self._x - 4:self._x + 4, :] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._x = int(self.np_random.integers(8, 76))
        self._y = int(self.np_random.integers(8, 76))
        self._noise = self.np_random.integers(0, 40, size=(84, 84, self.channels), dtype=np.uint8)
        return self._frame(), {}

    def step(self, action):
        self._x = int(np.clip(self._x + (int(action) - 1) * 4, 4, 80))
        reward = 1.0 if self._x >= 42 else 0.0
        terminated = bool(self.np_random.random() < 0.02)
        return self._frame(), reward, terminated, False, {}

    def render(self):
        frame = self._frame()
        return np.repeat(frame, 3, axis=2) if self.channels == 1 else frame[..., :3]


def make_frame_env(channels: int = 1, max_steps: int = 50, render_mode: str | None = None) -> gym.Env:
    return TimeLimit(FrameEnv(channels, render_mode), max_episode_steps=max_steps)


class NanEnv(gym.Env):
    """Returns a NaN observation at step ``at`` (for VecCheckNan)."""

    def __init__(self, at: int = 3) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.at = at
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self._t += 1
        value = np.nan if self._t == self.at else float(self._t)
        return np.full(2, value, dtype=np.float32), 0.0, False, False, {}


def make_nan_env(at: int = 3) -> gym.Env:
    return NanEnv(at)


class CrashingMaskedEnv(MaskedEnv):
    """A :class:`MaskedEnv` whose ``step`` raises once it has taken ``crash_at`` steps (for restarts)."""

    def __init__(self, crash_at: int = 3, index: int = 0) -> None:
        super().__init__(index=index)
        self.crash_at = crash_at
        self._steps = 0

    def step(self, action):
        self._steps += 1
        if self._steps >= self.crash_at:
            raise RuntimeError(f"crash after {self._steps} steps")
        return super().step(action)

    def current_mask(self) -> np.ndarray:
        """``action_masks()`` under another name: fetched through the pipe, not the mask buffer."""
        return self.action_masks()


def make_masked_env_with_crash(index: int = 0, crash_at: int | None = None) -> gym.Env:
    return CrashingMaskedEnv(crash_at if crash_at is not None else 10**9, index)
