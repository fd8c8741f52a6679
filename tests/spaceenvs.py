"""Envs whose spaces have no fixed size (``Text``, ``Sequence``, ``Graph``, ``OneOf``, a custom
``Space``), for tests/frontends/test_spaces.py.

Module level, so that spawn workers import them.  Deterministic given the seed: every
observation, reward, episode end and info comes from ``self.np_random``, and the reward and the
info depend on the action, so that a vec env and its reference built from the same factories
agree step for step.
"""

from __future__ import annotations

import functools
import string
import threading
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.spaces import GraphInstance
from gymnasium.wrappers import TimeLimit

CHARSET = string.ascii_letters + string.digits + " éß"  # non-ASCII characters too: UTF-8 in the codec


class Tag:
    """A custom value: what :class:`TagSpace` holds (compared by value, pickled by reference)."""

    def __init__(self, name: str, level: int) -> None:
        self.name, self.level = name, level

    def __eq__(self, other: object) -> bool:
        return type(other) is Tag and (self.name, self.level) == (other.name, other.level)

    def __hash__(self) -> int:
        return hash((self.name, self.level))

    def __repr__(self) -> str:
        return f"Tag({self.name!r}, {self.level})"


class TagSpace(spaces.Space):
    """A custom ``Space`` subclass: values are :class:`Tag` objects, of no fixed size."""

    def __init__(self, levels: int = 5, seed: int | None = None) -> None:
        self.levels = levels
        super().__init__(None, None, seed)

    def sample(self, mask: Any = None, probability: Any = None) -> Tag:
        rng = self.np_random
        name = "".join(rng.choice(list("abcxyz"), size=int(rng.integers(0, 6))))
        return Tag(name, int(rng.integers(self.levels)))

    def contains(self, x: Any) -> bool:
        return isinstance(x, Tag) and 0 <= x.level < self.levels

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TagSpace) and other.levels == self.levels

    def __repr__(self) -> str:
        return f"TagSpace({self.levels})"


class OpaqueSpace(spaces.Space):
    """A custom ``Space`` subclass without ``__eq__``: two instances never compare equal."""

    def __init__(self) -> None:
        super().__init__(None, None)

    def sample(self, mask: Any = None, probability: Any = None) -> int:
        return 0

    def contains(self, x: Any) -> bool:
        return x == 0

    def __repr__(self) -> str:
        return "OpaqueSpace()"


OBS_KINDS = ("text", "sequence", "sequence_stack", "graph", "oneof", "custom", "image_text", "tuple_text")
ACT_KINDS = ("discrete", "text", "dict_text")


def make_obs_space(kind: str) -> spaces.Space:
    if kind == "text":
        return spaces.Text(max_length=12, charset=CHARSET)
    if kind == "sequence":
        return spaces.Sequence(spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32))
    if kind == "sequence_stack":
        return spaces.Sequence(spaces.Discrete(9), stack=True)
    if kind == "graph":
        return spaces.Graph(node_space=spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
                            edge_space=spaces.Discrete(4))
    if kind == "oneof":
        return spaces.OneOf((spaces.Discrete(5), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)))
    if kind == "custom":
        return TagSpace()
    if kind == "image_text":  # the image stays in shared memory, only the text travels pickled
        return spaces.Dict({"image": spaces.Box(0, 255, shape=(6, 6, 3), dtype=np.uint8),
                            "caption": spaces.Text(max_length=10, charset=CHARSET)})
    if kind == "tuple_text":
        return spaces.Tuple((spaces.Discrete(3), spaces.Text(max_length=6, charset=CHARSET), spaces.Box(-1.0, 1.0, (2,))))
    raise ValueError(kind)


def make_act_space(kind: str) -> spaces.Space:
    if kind == "discrete":
        return spaces.Discrete(3)
    if kind == "text":
        return spaces.Text(max_length=6, charset="abcd")
    if kind == "dict_text":
        return spaces.Dict({"move": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
                            "say": spaces.Text(max_length=5, charset="xyz")})
    raise ValueError(kind)


def _text(rng: np.random.Generator, max_length: int) -> str:
    return "".join(rng.choice(list(CHARSET), size=int(rng.integers(0, max_length + 1))))


def draw_obs(kind: str, rng: np.random.Generator) -> Any:
    """One observation of ``kind`` drawn from ``rng`` (ragged: lengths differ between envs)."""
    if kind == "text":
        return _text(rng, 12)
    if kind == "sequence":
        return tuple(rng.uniform(-1, 1, size=2).astype(np.float32) for _ in range(int(rng.integers(0, 4))))
    if kind == "sequence_stack":
        return rng.integers(0, 9, size=int(rng.integers(0, 4)))
    if kind == "graph":
        n_nodes, n_edges = int(rng.integers(1, 4)), int(rng.integers(0, 4))
        return GraphInstance(nodes=rng.uniform(-1, 1, size=(n_nodes, 3)).astype(np.float32),
                             edges=rng.integers(0, 4, size=n_edges),
                             edge_links=rng.integers(0, n_nodes, size=(n_edges, 2)))
    if kind == "oneof":
        if rng.random() < 0.5:
            return (0, np.int64(rng.integers(5)))
        return (1, rng.uniform(-1, 1, size=2).astype(np.float32))
    if kind == "custom":
        return Tag("".join(rng.choice(list("abcxyz"), size=int(rng.integers(0, 6)))), int(rng.integers(5)))
    if kind == "image_text":
        return {"image": rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8), "caption": _text(rng, 10)}
    if kind == "tuple_text":
        return (np.int64(rng.integers(3)), _text(rng, 6)[:6], rng.uniform(-1, 1, size=2).astype(np.float32))
    raise ValueError(kind)


def action_score(kind: str, action: Any) -> float:
    """What an action adds to the reward (so that a wrong action shows)."""
    if kind == "discrete":
        return float(action)
    if kind == "text":
        return len(action) + 0.5 * str(action).count("a")
    return float(np.sum(action["move"])) + len(action["say"])


class SpaceEnv(gym.Env):
    """Observations of ``obs_kind``, actions of ``act_kind``; ends at random (``term_prob``);
    every third step's info holds the action it got (its type included) and a counter."""

    def __init__(self, obs_kind: str = "text", act_kind: str = "discrete", term_prob: float = 0.12) -> None:
        self.obs_kind, self.act_kind = obs_kind, act_kind
        self.observation_space = make_obs_space(obs_kind)
        self.action_space = make_act_space(act_kind)
        self.term_prob = term_prob
        self.poison = False  # set_poison(): the next observations do not pickle
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        info = {"first": [draw_obs(self.obs_kind, self.np_random)]} if self.np_random.random() < 0.3 else {}
        return draw_obs(self.obs_kind, self.np_random), info

    def set_poison(self) -> None:
        """The next observations hold a lock: they do not pickle."""
        self.poison = True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        rng = self.np_random
        reward = float(rng.normal()) + action_score(self.act_kind, action)
        terminated = bool(rng.random() < self.term_prob)
        info: dict = {}
        if self._t % 3 == 0:
            info = {"t": self._t, "action": action if self.act_kind != "discrete" else int(action)}
        obs = draw_obs(self.obs_kind, rng)
        if self.poison:
            obs = Tag(threading.Lock(), 0)  # type: ignore[arg-type]
        return obs, reward, terminated, False, info


def make_space_env(obs_kind: str = "text", act_kind: str = "discrete", max_steps: int = 9) -> gym.Env:
    return TimeLimit(SpaceEnv(obs_kind, act_kind), max_episode_steps=max_steps)


def space_env_fns(obs_kind: str, act_kind: str, n: int) -> list:
    """Factories with different episode lengths, so that envs end on different steps."""
    return [functools.partial(make_space_env, obs_kind, act_kind, 7 + i % 4) for i in range(n)]


class BigTextEnv(SpaceEnv):
    """Text observations larger than a small mailbox: the results go through the pipe."""

    def __init__(self, act_kind: str = "text") -> None:
        super().__init__("text", act_kind)
        self.observation_space = spaces.Text(max_length=5000, charset=CHARSET)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs * 300, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs * 300 + str(action), reward, terminated, truncated, info


def make_big_text_env() -> gym.Env:
    return TimeLimit(BigTextEnv(), max_episode_steps=6)


class OpaqueEnv(gym.Env):
    """Its observation space is a Space subclass without ``__eq__``: no two envs share it."""

    def __init__(self) -> None:
        self.observation_space = OpaqueSpace()
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: Any) -> tuple[int, float, bool, bool, dict]:
        return 0, 0.0, False, False, {}
