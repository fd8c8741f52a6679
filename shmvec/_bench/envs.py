"""The envs of the benchmark, by name; every class is module-level so spawned workers import it.

Names (``env_names()`` lists them; ``busy-<N>us`` and ``image-<H>x<W>x<C>`` take any size):

- ``CartPole-v1``: Gymnasium's CartPole through ``gym.make``: a cheap step (a few microseconds).
- ``CartPole-monitor``: the env SB3's ``make_vec_env("CartPole-v1", ...)`` builds: ``gym.make``
  wrapped in SB3's ``Monitor``, whose ``episode`` info every finished episode sends back to the
  parent (issue 2's speed targets are stated for it).  Needs stable-baselines3 where it runs.
- ``busy-200us``: a CartPole-shaped env whose step burns 200 microseconds of CPU (thread CPU
  time, so a descheduled process does not get its work done for free).
- ``image-84x84x4``, ``image-210x160x3``: uint8 image observations (Atari after the usual
  preprocessing, and a raw Atari frame); the step copies a pre-drawn frame, as an emulator would.
- ``CartPole-info``: CartPole with MuJoCo-style reward terms in ``info`` on every step.
- ``dict-obs``: CartPole with a ``Dict`` observation (a float vector, a small uint8 image, a
  discrete flag).
- ``zero-cost``: does nothing; used for the round-trip latency of one step.

Multi-agent envs (PettingZoo ``ParallelEnv``s, for the multi-agent backends only; their steps/s
count agent steps, one per agent row):

- ``pz-simple_spread``: MPE's ``simple_spread_v3`` from mpe2, 3 agents, 18 floats each, a cheap step;
- ``pz-pistonball``: butterfly's ``pistonball_v6`` (``pettingzoo[butterfly]``), 20 agents, each a
  457x120x3 uint8 image, a physics step (pymunk) and a render per step: a heavy env.

This module imports only numpy and gymnasium (0.29 or 1.x) at import time (PettingZoo and the
env packages inside the factories), so a benchmark helper process in another interpreter
(PufferLib's venv) can import it.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

_BUSY = re.compile(r"^busy-(\d+)us$")
_IMAGE = re.compile(r"^image-(\d+)x(\d+)x(\d+)$")
_FIXED = ("CartPole-v1", "CartPole-monitor", "CartPole-info", "dict-obs", "zero-cost")
# Envs that import stable-baselines3 (not there in a helper interpreter such as PufferLib's venv).
SB3_ENVS = ("CartPole-monitor",)
# Episode length of the synthetic envs (then truncated), so that resets happen as in real training.
EPISODE_STEPS = 500


#: Multi-agent envs: name -> (modules they need, what they are).
MULTIAGENT: dict[str, tuple[tuple[str, ...], str]] = {
    "pz-simple_spread": (("pettingzoo", "mpe2"), "MPE simple_spread_v3 (mpe2), 3 agents"),
    "pz-pistonball": (("pettingzoo", "pymunk", "pygame"),
                      "butterfly pistonball_v6 (pettingzoo[butterfly]), 20 agents, 457x120x3 images"),
}


def env_names() -> list[str]:
    """Example names of every kind of env (busy and image envs take any size)."""
    return ["CartPole-v1", "CartPole-monitor", "busy-200us", "image-84x84x4", "image-210x160x3", "CartPole-info",
            "dict-obs", "zero-cost", *MULTIAGENT]


def is_multiagent(name: str) -> bool:
    """Whether ``name`` is a multi-agent (PettingZoo) env of the benchmark."""
    return name in MULTIAGENT


def env_missing(name: str) -> str | None:
    """Why env ``name`` cannot be built here (a package it needs is not installed), or None."""
    import importlib.util

    for module in MULTIAGENT.get(name, ((), ""))[0]:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def check_env_name(name: str) -> str:
    """Returns ``name`` if it names a benchmark env; raises ``ValueError`` saying which exist otherwise."""
    if name in _FIXED or name in MULTIAGENT or _BUSY.match(name) or _IMAGE.match(name):
        return name
    raise ValueError(
        f"unknown benchmark env {name!r}: choose from {', '.join(env_names())} "
        "(busy-<N>us and image-<H>x<W>x<C> take any size)"
    )


class BusyEnv(gym.Env):
    """CartPole-shaped env whose step burns ``us`` microseconds of this thread's CPU time."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, us: int = 200) -> None:
        self.seconds = us * 1e-6
        self._obs = np.zeros(4, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._obs[:] = self.np_random.uniform(-0.05, 0.05, 4)
        return self._obs.copy(), {}

    def step(self, action: Any) -> tuple:
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass
        self._obs[0] += 0.01 if action else -0.01
        return self._obs.copy(), 1.0, False, False, {}


@functools.lru_cache(maxsize=None)
def _frames(shape: tuple[int, ...]) -> np.ndarray:
    # Four frames per process, shared by its envs: memory stays that of the observations in flight.
    return np.random.default_rng(0).integers(0, 256, (4, *shape), dtype=np.uint8)


class ImageEnv(gym.Env):
    """uint8 image observations of ``shape``; a step copies one of four pre-drawn frames."""

    action_space = spaces.Discrete(4)

    def __init__(self, shape: tuple[int, int, int] = (84, 84, 4)) -> None:
        self.shape = tuple(shape)
        self.observation_space = spaces.Box(0, 255, self.shape, np.uint8)
        self._k = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._k = 0
        return _frames(self.shape)[0].copy(), {}

    def step(self, action: Any) -> tuple:
        self._k += 1
        return _frames(self.shape)[(self._k + int(action)) % 4].copy(), 0.0, False, False, {}


class InfoEveryStep(gym.Wrapper):
    """CartPole with MuJoCo-style reward terms in ``info`` on every step (a non-empty info each step)."""

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info.update(
            reward_run=float(obs[1]),
            reward_ctrl=-0.1 * float(action),
            x_position=float(obs[0]),
            x_velocity=float(obs[1]),
            reward_survive=1.0,
        )
        return obs, reward, terminated, truncated, info


class DictObs(gym.ObservationWrapper):
    """CartPole with a Dict observation: the state, a 16x16x1 uint8 image of it, a discrete flag."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = spaces.Dict(
            {
                "state": env.observation_space,
                "image": spaces.Box(0, 255, (16, 16, 1), np.uint8),
                "flag": spaces.Discrete(2),
            }
        )
        self._image = np.zeros((16, 16, 1), np.uint8)

    def observation(self, observation: np.ndarray) -> dict[str, Any]:
        image = self._image.copy()
        col = int(np.clip((observation[0] + 2.4) / 4.8 * 15, 0, 15))
        image[:, col, 0] = 255
        return {"state": observation, "image": image, "flag": int(observation[2] > 0)}


class ZeroCost(gym.Env):
    """An env that does nothing: what remains of a step is the vec env's own cost."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple:
        return np.zeros(4, np.float32), 0.0, False, False, {}


class ParallelEnvFactory:
    """A picklable callable that builds one multi-agent benchmark env (a PettingZoo ``ParallelEnv``) by name."""

    def __init__(self, name: str) -> None:
        if name not in MULTIAGENT:
            raise ValueError(f"{name!r} is not a multi-agent benchmark env: choose from {', '.join(MULTIAGENT)}")
        self.name = name

    def __call__(self) -> Any:
        if self.name == "pz-simple_spread":
            from mpe2 import simple_spread_v3

            return simple_spread_v3.parallel_env(N=3)
        from pettingzoo.butterfly import pistonball_v6

        return pistonball_v6.parallel_env()

    def __repr__(self) -> str:
        return f"ParallelEnvFactory({self.name!r})"


class AgentSteps(gym.Env):
    """One ``ParallelEnv`` behind the single-agent API, for the bare loops of the multi-agent envs:
    the action is a ``Tuple`` of every agent's (only the live agents' are sent), the episode ends
    when no agent is left; ``agents_per_step`` converts the loops' env steps into agent steps."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.agents = list(env.possible_agents)
        self.agents_per_step = len(self.agents)
        self.action_space = spaces.Tuple([env.action_space(a) for a in self.agents])
        self.observation_space = spaces.Tuple([env.observation_space(a) for a in self.agents])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple:
        live = set(self.env.agents)
        obs, rew, _, _, infos = self.env.step({a: x for a, x in zip(self.agents, action) if a in live})
        return obs, float(sum(rew.values())), not self.env.agents, False, {}

    def close(self) -> None:
        self.env.close()


class EnvFactory:
    """A picklable callable that builds one benchmark env by name (what every backend is given);
    a multi-agent env comes as :class:`AgentSteps` (for the bare loops)."""

    def __init__(self, name: str) -> None:
        self.name = check_env_name(name)

    def __call__(self) -> gym.Env:
        name = self.name
        if name == "CartPole-v1":
            return gym.make("CartPole-v1")
        if name == "CartPole-monitor":
            from stable_baselines3.common.monitor import Monitor  # what make_vec_env wraps each env in

            return Monitor(gym.make("CartPole-v1"))
        if name == "CartPole-info":
            return InfoEveryStep(gym.make("CartPole-v1"))
        if name == "dict-obs":
            return DictObs(gym.make("CartPole-v1"))
        if name == "zero-cost":
            return ZeroCost()
        if name in MULTIAGENT:
            return AgentSteps(ParallelEnvFactory(name)())
        busy = _BUSY.match(name)
        if busy:
            return gym.wrappers.TimeLimit(BusyEnv(int(busy.group(1))), EPISODE_STEPS)
        h, w, c = (int(g) for g in _IMAGE.match(name).groups())  # type: ignore[union-attr]
        return gym.wrappers.TimeLimit(ImageEnv((h, w, c)), EPISODE_STEPS)

    def __repr__(self) -> str:
        return f"EnvFactory({self.name!r})"


def obs_nbytes(space: gym.Space) -> int:
    """Bytes of one observation of ``space`` (sum over the leaves of Dict/Tuple spaces)."""
    if isinstance(space, spaces.Dict):
        return sum(obs_nbytes(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return sum(obs_nbytes(s) for s in space.spaces)
    shape = space.shape or ()
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(space.dtype or np.int64).itemsize
