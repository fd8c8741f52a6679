"""Environments for the shmvec tests.

Everything here is module level so that ``spawn`` and ``forkserver`` workers can
import it (``tests/`` is on ``sys.path`` under pytest's default import mode).
Factories are built with :func:`functools.partial` of module-level callables,
which pickle by reference.

The :class:`SpacesEnv` family is deterministic given its seed: observations,
rewards, episode ends and infos are all drawn from ``self.np_random``, so a
``ShmVecEnv`` and a ``DummyVecEnv`` built from the same factories and seeds must
agree step for step.
"""

from __future__ import annotations

import collections

import functools
import os
import signal
import sys
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

# ---------------------------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------------------------

OBS_KINDS = ("box", "image", "discrete", "multidiscrete", "multibinary", "dict", "tuple")
ACT_KINDS = ("discrete", "box", "multidiscrete", "multibinary")


def make_obs_space(kind: str) -> spaces.Space:
    if kind == "box":
        return spaces.Box(-10.0, 10.0, shape=(5,), dtype=np.float32)
    if kind == "image":
        return spaces.Box(0, 255, shape=(8, 8, 3), dtype=np.uint8)
    if kind == "discrete":
        return spaces.Discrete(7)
    if kind == "multidiscrete":
        return spaces.MultiDiscrete([3, 4, 5])
    if kind == "multibinary":
        return spaces.MultiBinary(6)
    if kind == "dict":
        return spaces.Dict({
            "pos": spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32),
            "mode": spaces.Discrete(4),
        })
    if kind == "tuple":
        return spaces.Tuple((
            spaces.Box(-10.0, 10.0, shape=(2, 2), dtype=np.float64),
            spaces.MultiBinary(4),
        ))
    if kind == "nested":
        return spaces.Dict({
            "inner": spaces.Dict({
                "vec": spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32),
                "choice": spaces.Discrete(5),
            }),
            "pair": spaces.Tuple((
                spaces.MultiDiscrete([2, 3]),
                spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8),
            )),
            "flag": spaces.MultiBinary(3),
        })
    raise ValueError(f"unknown observation kind {kind!r}")


def make_act_space(kind: str) -> spaces.Space:
    if kind == "discrete":
        return spaces.Discrete(3)
    if kind == "box":
        return spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    if kind == "multidiscrete":
        return spaces.MultiDiscrete([2, 3])
    if kind == "multibinary":
        return spaces.MultiBinary(3)
    if kind == "multidiscrete_u8":
        return spaces.MultiDiscrete([2, 200], dtype=np.uint8)
    if kind == "box_i32":
        return spaces.Box(-100, 100, shape=(2,), dtype=np.int32)
    if kind == "box_bool":
        return spaces.Box(0, 1, shape=(2,), dtype=np.bool_)
    raise ValueError(f"unknown action kind {kind!r}")


def draw(space: spaces.Space, rng: np.random.Generator, shift: float = 0.0) -> Any:
    """A value of ``space`` drawn from ``rng`` (not from the space's own generator)."""
    if isinstance(space, spaces.Dict):
        return {key: draw(sub, rng, shift) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(draw(sub, rng, shift) for sub in space.spaces)
    if isinstance(space, spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        return rng.integers(space.nvec).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, size=space.shape).astype(space.dtype)
    if isinstance(space, spaces.Box):
        if np.issubdtype(space.dtype, np.integer):
            return rng.integers(space.low, space.high, size=space.shape, endpoint=True).astype(space.dtype)
        value = rng.uniform(-1.0, 1.0, size=space.shape) + shift
        return np.clip(value, space.low, space.high).astype(space.dtype)
    raise TypeError(f"cannot draw from {space}")


# ---------------------------------------------------------------------------------------------
# The deterministic env
# ---------------------------------------------------------------------------------------------

class SpacesEnv(gym.Env):
    """A deterministic seeded env with a configurable observation and action space.

    - observations, rewards and episode ends come from ``self.np_random``;
    - the reward depends on the action;
    - ``terminated`` happens at random (probability ``term_prob`` per step), the
      factory adds a ``TimeLimit`` for ``truncated``;
    - ``info`` is empty except every ``info_every`` steps;
    - ``reset(options={"offset": x})`` shifts the observations and rewards of the episode;
    - ``reset`` returns a non-empty info;
    - ``scale`` (attribute) multiplies the rewards, ``bump(k)`` (method) adds to a counter.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, obs_kind: str = "box", act_kind: str = "discrete", term_prob: float = 0.05,
                 info_every: int = 3, render_mode: str | None = None, tag: int = 0) -> None:
        self.obs_kind = obs_kind
        self.act_kind = act_kind
        self.observation_space = make_obs_space(obs_kind)
        self.action_space = make_act_space(act_kind)
        self.term_prob = term_prob
        self.info_every = info_every
        self.render_mode = render_mode
        self.tag = tag
        self.scale = 1.0
        self.counter = 0
        self.episodes = 0
        self._t = 0
        self._offset = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        self._offset = float(options.get("offset", 0.0)) if options else 0.0
        self.episodes += 1
        obs = draw(self.observation_space, self.np_random, self._offset)
        info = {"episode_start": float(self.np_random.random()), "offset": self._offset, "tag": self.tag}
        return obs, info

    @property
    def worker_pid(self) -> int:
        """The pid of the process that holds this env (a vec env's worker)."""
        return os.getpid()

    def step(self, action):
        self._t += 1
        a = float(np.sum(np.asarray(action, dtype=np.float64)))
        reward = self.scale * (0.5 * a + float(self.np_random.normal()) + self._offset)
        terminated = bool(self.np_random.random() < self.term_prob)
        obs = draw(self.observation_space, self.np_random, self._offset)
        info: dict[str, Any] = {}
        if self._t % self.info_every == 0:
            info = {"x": float(self.np_random.random()), "t": self._t, "action_sum": a}
        return obs, reward, terminated, False, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return np.full((4, 6, 3), (self.tag * 10 + self._t) % 256, dtype=np.uint8)

    # custom API for env_method / get_attr / set_attr
    def bump(self, k: int = 1, *, times: int = 1) -> int:
        self.counter += k * times
        return self.counter

    def describe(self) -> str:
        return f"{self.obs_kind}/{self.act_kind}#{self.tag}"

    def fail(self, message: str = "env_method failure"):
        raise KeyError(message)

    def make_lock(self):
        return threading.Lock()  # cannot be pickled back to the parent

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.tag


def make_spaces_env(obs_kind: str = "box", act_kind: str = "discrete", index: int = 0,
                    max_steps: int | None = None, **kwargs: Any) -> gym.Env:
    """A ``SpacesEnv`` under a ``TimeLimit`` whose length depends on ``index`` (so envs truncate at different steps)."""
    env = SpacesEnv(obs_kind, act_kind, tag=index, **kwargs)
    return TimeLimit(env, max_episode_steps=max_steps if max_steps is not None else 12 + index % 7)


class SlowStep(gym.Wrapper):
    """Busy-waits ``seconds`` in every ``step`` (a slow env that keeps its core, unlike a sleep)."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


def make_slow_spaces_env(seconds: float, index: int = 0) -> gym.Env:
    """``make_spaces_env("box", "discrete", index)`` that busy-waits ``seconds`` in each step."""
    return SlowStep(make_spaces_env("box", "discrete", index), seconds)


class CallableInfo(gym.Wrapper):
    """Puts a function that only cloudpickle can carry (a closure) in every step's info."""

    def step(self, action):
        obs, rew, term, trunc, info = super().step(action)
        factor = self.get_wrapper_attr("tag") + 2
        return obs, rew, term, trunc, dict(info, scale=lambda x: x * factor)


def make_callable_info_env(index: int = 0) -> gym.Env:
    return CallableInfo(make_spaces_env("box", "discrete", index))


def spaces_env_fns(obs_kind: str, act_kind: str, n_envs: int, **kwargs: Any) -> list:
    return [functools.partial(make_spaces_env, obs_kind, act_kind, i, **kwargs) for i in range(n_envs)]


def make_bare_env(obs_kind: str = "box", act_kind: str = "discrete", index: int = 0, **kwargs: Any) -> gym.Env:
    """A ``SpacesEnv`` without wrappers (so ``set_attr`` reaches the env itself)."""
    return SpacesEnv(obs_kind, act_kind, tag=index, **kwargs)


def bare_env_fns(n_envs: int, **kwargs: Any) -> list:
    return [functools.partial(make_bare_env, index=i, **kwargs) for i in range(n_envs)]


def make_render_env(index: int = 0) -> gym.Env:
    return SpacesEnv("box", "discrete", tag=index, render_mode="rgb_array", term_prob=0.0)


# ---------------------------------------------------------------------------------------------
# Misbehaving envs
# ---------------------------------------------------------------------------------------------

class EnvBoom(Exception):
    """Raised by :class:`RaisingEnv`; picklable, so it crosses to the parent as itself."""


class AwkwardError(Exception):
    """An exception whose constructor does not accept its own ``args``: it cannot be unpickled."""

    def __init__(self, code: int, where: str) -> None:
        super().__init__(f"awkward failure {code} in {where}")
        self.code = code


class RaisingEnv(gym.Env):
    """Raises in ``step`` (or ``reset``) once ``fail_at`` steps have been taken."""

    def __init__(self, fail_at: int = 3, exc: str = "boom", in_reset: bool = False) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.fail_at = fail_at
        self.exc = exc
        self.in_reset = in_reset
        self._t = 0

    def _raise(self):
        if self.exc == "awkward":
            raise AwkwardError(7, "step")
        raise EnvBoom(f"boom after {self._t} steps")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.in_reset:
            self._raise()
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self._t += 1
        if self._t >= self.fail_at:
            self._raise()
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


def make_raising_env(fail_at: int = 3, exc: str = "boom", in_reset: bool = False) -> gym.Env:
    return RaisingEnv(fail_at, exc, in_reset)


class SuicideEnv(gym.Env):
    """Ends its own process in ``step`` after ``at`` steps: ``os._exit(code)`` or SIGKILL."""

    def __init__(self, at: int = 2, how: str = "kill", code: int = 3) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.at = at
        self.how = how
        self.code = code
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self._t += 1
        if self._t >= self.at:
            if self.how == "exit":
                os._exit(self.code)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


def make_suicide_env(at: int = 2, how: str = "kill", code: int = 3) -> gym.Env:
    return SuicideEnv(at, how, code)


class BadObsEnv(gym.Env):
    """Declares a (3,) Box but returns a (4,) array in ``step`` (or in ``reset``)."""

    def __init__(self, in_reset: bool = False, bad_dtype: bool = False) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.in_reset = in_reset
        self.bad_dtype = bad_dtype

    def _bad(self):
        if self.bad_dtype:
            return np.array(["a", "b", "c"])
        return np.zeros(4, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return (self._bad() if self.in_reset else np.zeros(3, dtype=np.float32)), {}

    def step(self, action):
        return self._bad(), 0.0, False, False, {}


def make_bad_obs_env(in_reset: bool = False, bad_dtype: bool = False) -> gym.Env:
    return BadObsEnv(in_reset, bad_dtype)


class SleepyEnv(gym.Env):
    """Sleeps ``seconds`` in ``step`` and ``reset_seconds`` in ``reset`` (stands in for an env that hangs)."""

    def __init__(self, seconds: float = 60.0, reset_seconds: float = 0.0) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.seconds = seconds
        self.reset_seconds = reset_seconds

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        time.sleep(self.reset_seconds)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        time.sleep(self.seconds)
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


def make_sleepy_env(seconds: float = 60.0, reset_seconds: float = 0.0) -> gym.Env:
    return SleepyEnv(seconds, reset_seconds)


class CloseFailEnv(SpacesEnv):
    """Raises in ``close()``."""

    def close(self):
        raise EnvBoom(f"close failed in env {self.tag}")


def make_close_fail_env(index: int = 0) -> gym.Env:
    return CloseFailEnv("box", "discrete", tag=index)


class BigInfoEnv(SpacesEnv):
    """Returns an info holding a large array every step (larger than a small mailbox)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info = dict(info, blob=np.full(4096, self._t, dtype=np.int64))
        return obs, reward, terminated, truncated, info


def make_big_info_env(index: int = 0) -> gym.Env:
    return TimeLimit(BigInfoEnv("box", "discrete", tag=index), max_episode_steps=10 + index)


class MixedInfoEnv(SpacesEnv):
    """Infos of many types every step (numpy scalars and arrays, nested containers, text); every
    fourth step also a value the info codec declines (an OrderedDict), so that both the codec and
    the pickle fallback carry them."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        t = self._t
        info = dict(info, f64=np.float64(t / 3), i32=np.int32(-t), flag=np.bool_(t % 2),
                    arr=np.arange(3, dtype=np.float32) * t, nested={"a": [t, (True, None, 1.5)], 7: "x"},
                    text=f"step {t} \u00e9")
        if t % 4 == 0:
            info["odd"] = collections.OrderedDict(step=t)
        return obs, reward, terminated, truncated, info


def make_mixed_info_env(index: int = 0) -> gym.Env:
    return TimeLimit(MixedInfoEnv("box", "discrete", tag=index), max_episode_steps=9 + index)


class RepeatedTextInfoEnv(SpacesEnv):
    """An info that the info codec writes out in full but a pickle stores once (40 references
    to one string, which pickle's memo shares): larger than a small slot encoded, not pickled."""

    NAME = "reward term " * 5

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, dict(info, names=[self.NAME] * 40, t=self._t)


def make_repeated_text_info_env(index: int = 0) -> gym.Env:
    return TimeLimit(RepeatedTextInfoEnv("box", "discrete", tag=index), max_episode_steps=7 + index)


class TextEnv(gym.Env):
    """An observation space without a fixed size: ``Text`` (its values travel pickled)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Text(max_length=8)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "hello", {}

    def step(self, action):
        return "hello", 0.0, False, False, {}


def make_text_env() -> gym.Env:
    return TextEnv()


def make_not_a_space_env() -> gym.Env:
    """An env whose observation space is no ``gymnasium.spaces.Space`` (a string)."""
    env = TextEnv()
    env.observation_space = "text"  # type: ignore[assignment]
    return env


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def exit_instead_of_building() -> gym.Env:
    """A factory that calls sys.exit(3) (a script's argument check, say) instead of building."""
    sys.exit(3)


# ---------------------------------------------------------------------------------------------
# Misbehaving factories
# ---------------------------------------------------------------------------------------------

def failing_factory() -> gym.Env:
    raise EnvBoom("the factory failed")


def not_an_env_factory() -> Any:
    return 42


def dying_factory() -> gym.Env:
    os._exit(5)


class EchoActionEnv(gym.Env):
    """Returns the action it received in its info; Dict or Tuple action space.

    Its observations are float64 values in a float32 Box (a common env bug that
    vec envs tolerate by casting), and it terminates every ``period`` steps.
    """

    def __init__(self, kind: str = "dict", period: int = 3) -> None:
        self.observation_space = spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
        if kind == "dict":
            self.action_space = spaces.Dict({"move": spaces.Discrete(3), "force": spaces.Box(-1.0, 1.0, shape=(2,))})
        else:
            self.action_space = spaces.Tuple((spaces.MultiBinary(2), spaces.Discrete(4)))
        self.period = period
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._t / 3.0, 0.1], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 0.0, self._t % self.period == 0, False, {"action": action}


def make_echo_env(kind: str = "dict") -> gym.Env:
    return EchoActionEnv(kind)


class LockInfoEnv(SpacesEnv):
    """Puts an unpicklable object into its info at step ``at``."""

    def __init__(self, index: int = 0, at: int = 2) -> None:
        super().__init__("box", "discrete", term_prob=0.0, tag=index)
        self.at = at

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self._t == self.at:
            info = dict(info, lock=threading.Lock())
        return obs, reward, terminated, truncated, info


def make_lock_info_env(index: int = 0, at: int = 2) -> gym.Env:
    return LockInfoEnv(index, at)


class RaiseOnLoad:
    """Pickles anywhere; unpickling it raises (an object only its own process can rebuild)."""

    def __reduce__(self):
        return (_refuse_to_load, ("only the worker can rebuild this",))


def _refuse_to_load(message: str) -> Any:
    raise LookupError(message)


class BadStrError(Exception):
    """An exception whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class PipeEnv(SpacesEnv):
    """Messages larger than a pipe's buffer, and the ways a worker's answer can go wrong.

    ``huge`` (bytes) at step ``at``: ``"info"`` returns an info that large, ``"raise"`` raises a
    RuntimeError carrying that many bytes, ``"exit"`` calls ``sys.exit(5)``, ``"bad_str"`` raises
    an exception whose ``str()`` raises, ``"reward"`` returns a reward numpy cannot convert.
    """

    def __init__(self, how: str = "", at: int = 2, huge: int = 2_000_000, tag: int = 0) -> None:
        super().__init__("box", "discrete", term_prob=0.0, tag=tag)
        self.how, self.at, self.huge = how, at, huge

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self._t == self.at:
            if self.how == "info":
                info = dict(info, blob=np.full(self.huge // 8, self.tag, dtype=np.int64))
            elif self.how == "raise":
                raise RuntimeError("a large exception", np.zeros(self.huge // 8))
            elif self.how == "exit":
                sys.exit(5)
            elif self.how == "bad_str":
                raise BadStrError()
            elif self.how == "reward":
                reward = "not a number"
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        level = (options or {}).get("level")
        self.option_sum = None if level is None else int(np.asarray(level).sum())
        return super().reset(seed=seed, options=options)

    def last_option_sum(self) -> int | None:
        """The sum of the ``level`` array of the last reset's options."""
        return self.option_sum

    def size_of(self, value: Any) -> int:
        return len(value)

    def exit_now(self) -> None:
        sys.exit(7)

    def unloadable(self) -> RaiseOnLoad:
        return RaiseOnLoad()


def make_pipe_env(index: int = 0, **kwargs: Any) -> gym.Env:
    return PipeEnv(tag=index, **kwargs)


class LambdaMetadataEnv(SpacesEnv):
    """Its metadata holds a lambda: pickle cannot send it, cloudpickle can."""

    def __init__(self) -> None:
        super().__init__("box", "discrete")
        self.metadata = {"render_modes": [], "hook": lambda: None}


def make_lambda_metadata_env() -> gym.Env:
    return LambdaMetadataEnv()


class LockMetadataEnv(SpacesEnv):
    """Its metadata holds a lock, which neither pickle nor cloudpickle can send."""

    def __init__(self) -> None:
        super().__init__("box", "discrete")
        self.metadata = {"render_modes": [], "lock": threading.Lock()}


def make_lock_metadata_env() -> gym.Env:
    return LockMetadataEnv()


class UnevenInfoEnv(SpacesEnv):
    """Infos whose values differ in type and length from env to env: an int in even envs and a
    float in odd ones, arrays whose length depends on the env and the step, and bools."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        score = self._t * 3 if self.tag % 2 == 0 else self._t + 0.75
        info = dict(info, score=score, hits=np.arange(1 + (self.tag + self._t) % 3), ok=bool(self._t % 2))
        return obs, reward, terminated, truncated, info


def make_uneven_info_env(index: int = 0) -> gym.Env:
    return TimeLimit(UnevenInfoEnv("box", "discrete", tag=index), max_episode_steps=6 + index)


class WideIntPixelsEnv(gym.Env):
    """A uint8 image Box whose observations come as int64 arrays (as ``np.array(list_of_ints)``
    gives); pixel values run to ``top``, and one is 300 from step ``wrap_at`` on, when given."""

    def __init__(self, top: int = 255, wrap_at: int | None = None) -> None:
        self.observation_space = spaces.Box(0, 255, shape=(2, 3), dtype=np.uint8)
        self.action_space = spaces.Discrete(2)
        self.top, self.wrap_at, self._t = top, wrap_at, 0

    def _obs(self) -> np.ndarray:
        pixels = (np.arange(6, dtype=np.int64).reshape(2, 3) * 37 + self._t * 11) % (self.top + 1)
        if self.wrap_at is not None and self._t >= self.wrap_at:
            pixels[1, 2] = 300
        return pixels

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), float(action), self._t % 7 == 0, False, {}


def make_wide_int_pixels_env(wrap_at: int | None = None) -> gym.Env:
    return WideIntPixelsEnv(wrap_at=wrap_at)


class KwargsEnv(SpacesEnv):
    """Keeps the keyword arguments it was built with (``self.kwargs``), as they are."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("box", "discrete")
        self.kwargs = kwargs


class KeyOrderEnv(gym.Env):
    """Dict observation and action spaces whose keys come in the order given (``reverse``: the
    other way round); equal spaces either way (Gymnasium's Dict compares keys as a set).  Each
    env's observation carries its ``tag``; the info echoes the action it received."""

    def __init__(self, tag: int = 0, reverse: bool = False, dict_actions: bool = True) -> None:
        def ordered(items):
            return collections.OrderedDict(reversed(items) if reverse else items)

        self.tag = tag
        self.observation_space = spaces.Dict(ordered([("a", spaces.Box(-1e6, 1e6, (3,), np.float32)),
                                                      ("b", spaces.Box(0, 255, (5,), np.uint8))]))
        self.action_space = spaces.Dict(ordered([("x", spaces.Discrete(50)),
                                                 ("y", spaces.Box(-1.0, 1.0, (2,), np.float32))]))
        if not dict_actions:  # SB3 has no Dict actions
            self.action_space = spaces.Discrete(50)
        self._t = 0

    def _obs(self) -> dict:
        return {"a": np.full(3, self.tag * 100 + self._t, dtype=np.float32),
                "b": np.full(5, (self.tag * 10 + self._t) % 256, dtype=np.uint8)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        if isinstance(self.action_space, spaces.Dict):
            x, info = int(action["x"]), {"x": int(action["x"]), "y": np.asarray(action["y"]).tolist()}
        else:
            x, info = int(action), {"x": int(action)}
        return self._obs(), float(x), self._t % 4 == 0, False, info


def make_key_order_env(index: int = 0, dict_actions: bool = True) -> gym.Env:
    return KeyOrderEnv(tag=index, reverse=index >= 2, dict_actions=dict_actions)  # with 4 envs: worker 1's


class ArrayFlagsEnv(SpacesEnv):
    """Returns ``terminated`` and ``truncated`` as one-element arrays (as envs over batched
    simulators often do); DummyVecEnv takes them."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, np.array([terminated]), np.array([truncated]), info


def make_array_flags_env(index: int = 0) -> gym.Env:
    return TimeLimit(ArrayFlagsEnv("box", "discrete", tag=index, term_prob=0.2), max_episode_steps=6 + index)


class InfoAtEnv(SpacesEnv):
    """At step ``at``, returns ``info`` (a value the parent cannot use: one that does not
    unpickle there, or a list where SB3 wants a dict)."""

    def __init__(self, info: Any, at: int = 2, tag: int = 0) -> None:
        super().__init__("box", "discrete", term_prob=0.0, tag=tag)
        self.bad_info, self.at = info, at

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, (self.bad_info if self._t == self.at else info)


def make_unloadable_info_env(index: int = 0) -> gym.Env:
    return InfoAtEnv({"thing": RaiseOnLoad()}, tag=index)


def make_list_info_env(index: int = 0) -> gym.Env:
    return InfoAtEnv(["not", "a", "dict"], tag=index)


class ScalarLeavesEnv(gym.Env):
    """Observations with scalar leaves (``Box`` of shape ``()``, ``Discrete``), alone and nested;
    episodes of 2 steps.  The env returns what ``sample()`` gives: 0-d arrays and numpy ints."""

    SPACES = {
        "box": lambda: spaces.Box(-1, 1, shape=(), dtype=np.float32),
        "int_box": lambda: spaces.Box(0, 9, shape=(), dtype=np.int16),
        "dict": lambda: spaces.Dict({"a": spaces.Box(-1, 1, shape=(), dtype=np.float64), "b": spaces.Discrete(3),
                                     "c": spaces.MultiDiscrete(np.array(4))}),
        "tuple": lambda: spaces.Tuple((spaces.Box(-1, 1, shape=(), dtype=np.float32), spaces.MultiBinary(2),
                                       spaces.Box(0, 1, shape=(), dtype=np.bool_))),
    }

    def __init__(self, kind: str = "box") -> None:
        self.observation_space = self.SPACES[kind]()
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= 2, False, {}


def make_scalar_leaves_env(kind: str = "box") -> gym.Env:
    return ScalarLeavesEnv(kind)


def make_unbatchable_info_env(index: int = 0) -> gym.Env:
    """At step 2, env i's info["k"] is an array of 2 + i ones: Gymnasium's _add_info, which
    sizes its batch from the first env with the key, cannot batch them (ValueError)."""
    return InfoAtEnv({"k": np.ones(2 + index)}, tag=index)


# ---------------------------------------------------------------------------------------------
# For ShmVectorEnv's AsyncVectorEnv surface (tests/frontends/test_vector_async.py)
# ---------------------------------------------------------------------------------------------

class NapStep(gym.Wrapper):
    """Sleeps ``seconds`` in every ``step`` and ``reset_seconds`` in every ``reset``: a slow env
    that leaves its core to the others (unlike :class:`SlowStep`)."""

    def __init__(self, env: gym.Env, seconds: float, reset_seconds: float = 0.0) -> None:
        super().__init__(env)
        self.seconds = seconds
        self.reset_seconds = reset_seconds

    def reset(self, **kwargs):
        time.sleep(self.reset_seconds)
        return self.env.reset(**kwargs)

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


def make_napping_spaces_env(seconds: float, index: int = 0, reset_seconds: float = 0.0) -> gym.Env:
    """``make_spaces_env("box", "discrete", index)`` that sleeps ``seconds`` in each step."""
    return NapStep(make_spaces_env("box", "discrete", index), seconds, reset_seconds)


class BoundsEnv(SpacesEnv):
    """A :class:`SpacesEnv` whose observation space depends on ``index``: ``"dict"`` and ``"box"``
    only in bounds (Box low/high, Discrete n, MultiDiscrete nvec), what Gymnasium's
    ``observation_mode="different"`` batches; ``"shape"`` in shape, which it cannot."""

    def __init__(self, index: int = 0, kind: str = "dict") -> None:
        super().__init__("box", "discrete", tag=index)
        if kind == "dict":
            self.observation_space = spaces.Dict({
                "pos": spaces.Box(-1.0 - index, 1.0 + index, shape=(3,), dtype=np.float32),
                "mode": spaces.Discrete(3 + index),
                "counts": spaces.MultiDiscrete([2 + index, 3]),
            })
        elif kind == "box":
            self.observation_space = spaces.Box(-1.0 - index, 1.0 + 2 * index, shape=(4,), dtype=np.float64)
        elif kind == "shape":
            self.observation_space = spaces.Box(-1.0, 1.0, shape=(2 + index,), dtype=np.float32)
        else:
            raise ValueError(f"unknown kind {kind!r}")


def make_bounds_env(index: int = 0, kind: str = "dict") -> gym.Env:
    return TimeLimit(BoundsEnv(index, kind), max_episode_steps=9 + index)


class FakeParallelEnv:
    """Stands in for a PettingZoo ``ParallelEnv``: shmvec tells one by its module name (pettingzoo
    is not imported, nor installed here)."""

    __module__ = "pettingzoo.utils.env"
    possible_agents = ["a", "b"]


def make_fake_pettingzoo_env() -> Any:
    return FakeParallelEnv()


def make_vector_env_instead() -> Any:
    """A factory that builds a vector env where one env was expected."""
    return gym.vector.SyncVectorEnv([make_cartpole])
