"""Random spaces, infos and environments for the differential fuzz test (``test_fuzz.py``).

Everything here is module level, like ``testenvs.py``, so that ``spawn`` and ``forkserver``
workers can import it (``tests/`` is on ``sys.path`` under pytest's default import mode); the
factories are :func:`functools.partial` of :class:`FuzzEnv` and a frozen :class:`EnvConfig`.

:func:`make_case` draws a whole :class:`FuzzCase` from one integer seed:

- the observation and action spaces: ``Box`` of every integer, float and bool dtype and of
  shapes from ``()`` to 3-d, zero-size ones included, with finite, half-infinite and per-element
  bounds; ``Discrete`` and ``MultiDiscrete`` with a ``start``; ``MultiBinary``; and ``Dict`` or
  ``Tuple`` of these (nested, and empty now and then, for Gymnasium's face; one level for SB3's,
  which is what ``DummyVecEnv`` takes);
- the vec env's options: number of envs and workers, ``copy``, the mailbox size (down to 16
  bytes, so that infos overflow it) and Gymnasium's ``autoreset_mode``;
- one :class:`EnvConfig` per env: how often episodes end (terminated, truncated, both), the
  Python or numpy types of rewards and flags, observations in the space's own types or in looser
  ones, and an info schema shared by the case's envs (see :func:`info_value` for the kinds).

A :class:`FuzzEnv` is deterministic given its config: observations, rewards, episode ends and
infos all come from ``self.np_random`` (seeded from the config, re-seeded by ``reset(seed=...)``),
so the same factories give the same trajectory in ``DummyVecEnv``/``SyncVectorEnv`` and in
shmvec's workers.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_DTYPES = ("float16", "float32", "float64")
SHAPES = ((), (1,), (3,), (3, 1, 2), (0,), (2, 0), (4, 4), (2, 3, 2), (1, 1), (5,))
DICT_KEYS = ("a", "b", "obs", "pos", "z", "img", "k9", "_x")

# Info values (see info_value): every kind for SB3's face; Gymnasium's SyncVectorEnv batches
# each key into an array across envs, so there a key keeps one type and no key is special.
INFO_KINDS = ("float", "int", "bool", "npscalar", "array", "str", "longstr", "surrogate", "nested", "list",
              "tuple", "none", "bytes", "intkeys", "complex", "datetime", "npbool", "emptydict", "frozenset")
SB3_ONLY_INFO_KINDS = ("hugeint", "shared", "timelimit_key", "terminal_key", "mixed")
SCALAR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "float32", "float64", "longdouble", "complex64", "complex128", "clongdouble", "longlong",
                 "ulonglong")
ARRAY_DTYPES = ("bool", "int8", "uint16", "int32", "int64", "uint64", "float16", "float32", "float64",
                "complex64", "longdouble")
REWARD_STYLES = ("float", "int", "f32", "f64", "npint", "f16", "mixed", "hugeint", "longdouble", "array0d")
REWARD_WEIGHTS = (0.2, 0.15, 0.15, 0.1, 0.1, 0.05, 0.15, 0.04, 0.03, 0.03)
START_METHODS = ("fork", "forkserver", "spawn")


# ---------------------------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------------------------

def random_box(rng: np.random.Generator) -> spaces.Box:
    """A ``Box`` of a float (45%), integer (45%) or bool dtype, of any of :data:`SHAPES`."""
    shape = SHAPES[rng.integers(len(SHAPES))]
    u = rng.random()
    if u < 0.45:
        dtype = np.dtype(FLOAT_DTYPES[rng.integers(len(FLOAT_DTYPES))])
        kind = rng.integers(5)
        if kind == 0:
            low, high = -np.inf, np.inf
        elif kind == 1:
            low, high = -1.0, 1.0
        elif kind == 2:
            low, high = 0.0, np.inf
        elif kind == 3:
            low, high = -np.inf, float(rng.uniform(-5, 5))
        else:  # per-element bounds, some of them infinite
            limit = 1000.0 if dtype == np.float16 else 1e6
            low = rng.uniform(-limit, 0, size=shape)
            high = low + rng.uniform(0, limit, size=shape)
            low = np.where(rng.random(shape) < 0.3, -np.inf, low).astype(dtype)
            high = high.astype(dtype)
        return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    if u < 0.9:
        dtype = np.dtype(INT_DTYPES[rng.integers(len(INT_DTYPES))])
        info = np.iinfo(dtype)
        kind = rng.integers(3)
        if kind == 0:
            low, high = max(info.min, -3), min(info.max, 7)
        elif kind == 1 and dtype.itemsize <= 4:
            low, high = info.min, info.max
        else:
            big = 2 ** 40 if dtype.itemsize == 8 else info.max
            low, high = (0 if info.min == 0 else -big), big
        return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    return spaces.Box(low=0, high=1, shape=shape, dtype=np.bool_)


def random_leaf(rng: np.random.Generator) -> spaces.Space:
    """A ``Box`` (45%), ``Discrete`` (20%), ``MultiDiscrete`` (20%) or ``MultiBinary`` (15%)."""
    u = rng.random()
    if u < 0.45:
        return random_box(rng)
    if u < 0.65:
        start = (0, 0, -3, 5, 2 ** 33)[rng.integers(5)]
        return spaces.Discrete(int(rng.integers(1, 10)), start=start)
    if u < 0.85:
        nvec = (np.array([3]), np.array([2, 5, 7]), np.array([[2, 3], [4, 5]]), np.array([[[2], [3]]]))[rng.integers(4)]
        dtype = (np.int64, np.int64, np.int32, np.int16)[rng.integers(4)]
        start = rng.integers(-4, 4, size=nvec.shape) if rng.random() < 0.5 else None
        return spaces.MultiDiscrete(nvec, dtype=dtype, start=start)
    return spaces.MultiBinary((1, 4, (2, 3), (1,), (2, 1, 2))[rng.integers(5)])


def random_space(rng: np.random.Generator, max_depth: int, depth: int = 0) -> spaces.Space:
    """A leaf, or a ``Dict``/``Tuple`` (of up to 3 subspaces, 3% empty) nested up to ``max_depth``."""
    if depth >= max_depth or rng.random() < 0.45:
        return random_leaf(rng)
    n = 0 if rng.random() < 0.03 else int(rng.integers(1, 4))
    children = [random_space(rng, max_depth, depth + 1) for _ in range(n)]
    if rng.random() < 0.55:
        keys = rng.choice(DICT_KEYS, size=n, replace=False)
        return spaces.Dict({str(key): child for key, child in zip(keys, children)})
    return spaces.Tuple(children)


def has_empty_composite(space: spaces.Space) -> bool:
    """Whether ``space`` holds an empty ``Dict`` or ``Tuple`` at any depth."""
    if isinstance(space, spaces.Dict):
        subspaces = list(space.spaces.values())
    elif isinstance(space, spaces.Tuple):
        subspaces = list(space.spaces)
    else:
        return False
    return not subspaces or any(has_empty_composite(sub) for sub in subspaces)


def as_read_back(space: spaces.Space, value: Any) -> Any:
    """``value`` of ``space`` as shmvec reads it back from a shared buffer (a terminal observation).

    Each leaf in the space's dtype, a ``Discrete`` one as ``np.int64``, and a scalar ``Box``
    (shape ``()``) as ``Box.sample()`` gives it: a 0-d array for a float dtype, a numpy scalar
    for an integer or bool one (docs/sb3.md).  The identity on
    what the space's own ``sample()`` returns.
    """
    if isinstance(space, spaces.Dict):
        return type(value)((key, as_read_back(sub, value[key])) for key, sub in space.spaces.items())
    if isinstance(space, spaces.Tuple):
        return tuple(as_read_back(sub, v) for sub, v in zip(space.spaces, value))
    if isinstance(space, spaces.Discrete):
        return np.int64(value)
    array = np.asarray(value, dtype=space.dtype)
    if array.ndim == 0 and array.dtype.kind not in "fc":
        return array[()]
    return array


def loosen(space: spaces.Space, value: Any) -> Any:
    """The same value in the looser types an env may return: a Python ``int`` for ``Discrete``,
    float64 for a float leaf, int64 (uint64) for a signed (unsigned) integer leaf.  Both vec envs
    cast these into the space's dtype (numpy's "same_kind" casting, as ``SyncVectorEnv``'s)."""
    if isinstance(space, spaces.Dict):
        return {key: loosen(sub, value[key]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(loosen(sub, v) for sub, v in zip(space.spaces, value))
    if isinstance(space, spaces.Discrete):
        return int(value)
    array = np.asarray(value)
    wider = {"f": np.float64, "i": np.int64, "u": np.uint64}.get(array.dtype.kind)
    return array if wider is None else array.astype(wider)


def describe_action(action: Any) -> Any:
    """A comparable record of an action exactly as the env received it (types, dtypes, bytes)."""
    if isinstance(action, dict):
        return {"__dict__": {key: describe_action(v) for key, v in action.items()}}
    if isinstance(action, tuple):
        return ("__tuple__",) + tuple(describe_action(v) for v in action)
    if isinstance(action, np.ndarray):
        return ("ndarray", str(action.dtype), action.shape, action.tobytes())
    if isinstance(action, np.generic):
        return ("npscalar", type(action).__name__, str(action.dtype), action.tobytes())
    return ("py", type(action).__name__, repr(action))


# ---------------------------------------------------------------------------------------------
# Infos
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InfoField:
    """One key of an info schema: ``info[key]`` is drawn by :func:`info_value` with probability ``prob``."""

    kind: str
    key: str
    prob: float
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    sub: tuple[InfoField, ...] = ()


def random_info_schema(rng: np.random.Generator, gym_face: bool, depth: int = 0) -> tuple[InfoField, ...]:
    """Up to 5 keys (2 in a nested dict) of random kinds; SB3's face takes every kind."""
    kinds = INFO_KINDS if gym_face else INFO_KINDS + SB3_ONLY_INFO_KINDS
    fields: list[InfoField] = []
    for j in range(int(rng.integers(1, 6 if depth == 0 else 3))):
        kind = kinds[rng.integers(len(kinds))]
        if depth > 0 and kind in ("nested", "timelimit_key", "terminal_key"):
            kind = "float"
        key = {"timelimit_key": "TimeLimit.truncated", "terminal_key": "terminal_observation"}.get(kind, f"{kind}_{j}")
        if any(f.key == key for f in fields):
            continue
        prob = float((0.1, 0.5, 1.0)[rng.integers(3)])
        if kind == "npscalar":
            fields.append(InfoField(kind, key, prob, dtype=SCALAR_DTYPES[rng.integers(len(SCALAR_DTYPES))]))
        elif kind == "array":
            fields.append(InfoField(kind, key, prob, dtype=ARRAY_DTYPES[rng.integers(len(ARRAY_DTYPES))],
                                    shape=SHAPES[rng.integers(len(SHAPES))]))
        elif kind == "nested":
            fields.append(InfoField(kind, key, prob, sub=random_info_schema(rng, gym_face, depth + 1)))
        else:
            fields.append(InfoField(kind, key, prob))
    return tuple(fields)


def _text(rng: np.random.Generator, n: int) -> str:
    alphabet = "abcxyz_ .é漢字🙂\x00\n"
    return "".join(alphabet[i] for i in rng.integers(len(alphabet), size=n))


def _plain(rng: np.random.Generator, kind: str) -> Any:
    if kind == "float":
        if rng.random() < 0.15:
            return (float("nan"), float("inf"), -0.0, 1e308)[rng.integers(4)]
        return float(rng.normal())
    if kind == "int":
        return (0, -1, 2 ** 63 - 1, -(2 ** 63), int(rng.integers(-1000, 1000)))[rng.integers(5)]
    if kind == "bool":
        return bool(rng.random() < 0.5)
    return None


def _numpy_scalar(rng: np.random.Generator, dtype: np.dtype) -> np.generic:
    if dtype.kind == "b":
        return np.bool_(rng.random() < 0.5)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        draw_dtype = np.uint64 if dtype.kind == "u" else np.int64
        return dtype.type(int(rng.integers(int(info.min), int(info.max), endpoint=True, dtype=draw_dtype)))
    if dtype.kind == "c":
        return dtype.type(complex(rng.normal(), rng.normal()))
    return dtype.type("nan") if rng.random() < 0.1 else dtype.type(rng.normal() * 100)


def _numpy_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``dtype``, now and then a strided view, Fortran-ordered, byte-swapped or read-only."""
    values = rng.normal(size=shape) * 50
    if dtype.kind == "c":
        values = values + 1j * rng.normal(size=shape)
    array = np.asarray(np.abs(values).astype(dtype) if dtype.kind == "u" else values.astype(dtype))
    layout = rng.integers(6)
    if layout == 1 and array.ndim >= 1:
        array = np.repeat(array, 2, axis=0)[::2]
    elif layout == 2 and array.ndim >= 2:  # (asfortranarray makes a 0-d array 1-d)
        array = np.asfortranarray(array)
    elif layout == 3:
        array = array.astype(array.dtype.newbyteorder(">"))
    elif layout == 4:
        array = array.copy()
        array.flags.writeable = False
    return array


def info_value(rng: np.random.Generator, field: InfoField, gym_face: bool) -> Any:
    """A value of ``field.kind``.

    Python floats (NaN, inf, -0.0 too), ints (64-bit limits too), bools, ``None``, strings (with
    NUL, non-ASCII, an unpaired surrogate; short and long), bytes, complex, frozensets, lists and
    tuples of these (with an array or a dict inside, now and then), dicts with non-string keys,
    empty dicts, nested dicts; numpy scalars of every dtype (``longdouble``, ``clongdouble``,
    ``longlong`` included), ``datetime64``, arrays of many dtypes and layouts.  SB3's face only:
    ints beyond 64 bits, one list under two keys, the env's own ``TimeLimit.truncated`` and
    ``terminal_observation`` keys (SB3 writes over them), and a key whose type changes between steps.
    """
    kind = field.kind
    if kind in ("float", "int", "bool"):
        return _plain(rng, kind)
    if kind == "npscalar":
        return _numpy_scalar(rng, np.dtype(field.dtype))
    if kind == "array":
        return _numpy_array(rng, np.dtype(field.dtype), field.shape)
    if kind == "str":
        return _text(rng, int(rng.integers(0, 20)))
    if kind == "longstr":
        return _text(rng, int(rng.integers(60, 200)))
    if kind == "surrogate":
        return "x\ud800y"
    if kind == "nested":
        return random_info(rng, field.sub, gym_face)
    if kind in ("list", "tuple"):
        values: list[Any] = [_plain(rng, ("float", "int", "bool", "none")[rng.integers(4)])
                             for _ in range(rng.integers(0, 4))]
        if rng.random() < 0.3:
            values.append(np.arange(3, dtype=np.int16))
        if rng.random() < 0.3:
            values.append({"in": [1, (2, 3)]})
        return values if kind == "list" else tuple(values)
    if kind == "none":
        return None
    if kind == "bytes":
        return bytes(rng.integers(0, 256, size=int(rng.integers(0, 10))).astype(np.uint8))
    if kind == "intkeys":
        return {1: 1.5, 2: 2.5} if gym_face else {1: 1.5, 2: "two", (3, 4): None, None: True}
    if kind == "complex":
        return complex(rng.normal(), rng.normal())
    if kind == "datetime":
        return np.datetime64("2020-01-01") + np.timedelta64(int(rng.integers(100)), "D")
    if kind == "npbool":
        return np.bool_(rng.random() < 0.5)
    if kind == "emptydict":
        return {}
    if kind == "frozenset":
        return frozenset({1, 2, int(rng.integers(10))})
    if kind == "hugeint":
        return 2 ** 70 + int(rng.integers(100))
    if kind == "shared":
        shared = [1.0, 2.0]
        return {"a": shared, "b": shared}
    if kind == "timelimit_key":
        return bool(rng.random() < 0.5)
    if kind == "terminal_key":
        return np.float32(rng.normal())
    if kind == "mixed":
        return (1, 1.5, "s", None, np.float32(2), np.arange(2))[rng.integers(6)]
    raise ValueError(f"unknown info kind {kind!r}")


def random_info(rng: np.random.Generator, schema: tuple[InfoField, ...], gym_face: bool) -> dict:
    return {field.key: info_value(rng, field, gym_face) for field in schema if rng.random() < field.prob}


# ---------------------------------------------------------------------------------------------
# The env and the case
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Everything a :class:`FuzzEnv` is made of (picklable: it travels to spawn workers)."""

    obs_space: spaces.Space
    act_space: spaces.Space
    gym_face: bool
    seed: int
    name: str
    p_term: float
    p_trunc: float
    p_both: float
    max_len: int
    info_style: str      # "empty", "sparse" (30% of steps), "dense" or "reset_only"
    info_schema: tuple[InfoField, ...]
    reward_style: str    # one of REWARD_STYLES
    flag_style: str      # "bool", "np" (np.bool_) or "mixed"
    loose_obs: bool      # observations in looser types (see loosen)
    echo_action: bool    # info["act"] = describe_action(action)
    p_big: float         # probability of a 1.2 MB array in an info (larger than any mailbox)


class FuzzEnv(gym.Env):
    """A deterministic env of random spaces, rewards, episode ends and infos (see :class:`EnvConfig`).

    ``reset(options=...)`` echoes the options in its info (and sums a ``bigmap`` array); ``probe``,
    ``big_probe`` and ``boom`` are for ``env_method``/``call``.
    """

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig) -> None:
        self.env_config = config
        # Copies: the envs of a DummyVecEnv/SyncVectorEnv share one config, and each seeds its space.
        self.observation_space = copy.deepcopy(config.obs_space)
        self.action_space = copy.deepcopy(config.act_space)
        self.p_term = config.p_term
        self.t = 0
        self.episode = 0
        self.last_options: dict | None = None
        self._np_random, self._np_random_seed = gym.utils.seeding.np_random(config.seed)
        self._seed_space()

    def _seed_space(self) -> None:
        self.observation_space.seed(int(self.np_random.integers(2 ** 31)))

    def _obs(self) -> Any:
        obs = self.observation_space.sample()
        return loosen(self.observation_space, obs) if self.env_config.loose_obs else obs

    def _flag(self, value: bool) -> bool | np.bool_:
        style = self.env_config.flag_style
        if style == "np" or (style == "mixed" and self.np_random.random() < 0.5):
            return np.bool_(value)
        return bool(value)

    def _reward(self) -> Any:
        rng = self.np_random
        style = self.env_config.reward_style
        if style == "mixed":
            style = ("float", "int", "f32", "f64", "npint", "f16")[rng.integers(6)]
        x = rng.normal() * 10
        if style == "float":
            return float(x)
        if style == "int":
            return int(round(x))
        if style == "f32":
            return np.float32(x)
        if style == "f64":
            return np.float64(x)
        if style == "npint":
            return (np.int8, np.int32, np.int64, np.uint16)[rng.integers(4)](abs(int(x)))
        if style == "f16":
            return np.float16(x)
        if style == "hugeint":  # beyond float32 and float64 precision
            return (2 ** 60 + 2 ** 36 + 1, 2 ** 24 + 1, 2 ** 53 + 1, -(2 ** 62) - 2 ** 38 - 1, 16777217)[rng.integers(5)]
        if style == "longdouble":
            return np.longdouble(1) + np.longdouble(2) ** -60 * int(rng.integers(1, 5))
        if style == "array0d":
            return np.array(x, dtype=np.float64)
        raise ValueError(f"unknown reward style {style!r}")

    def _info(self, in_step: bool, action: Any = None) -> dict:
        config = self.env_config
        rng = self.np_random
        if config.info_style == "empty" or (config.info_style == "reset_only" and in_step):
            return {}
        if config.info_style == "sparse" and rng.random() < 0.7:
            return {}
        info = random_info(rng, config.info_schema, config.gym_face)
        if in_step and config.echo_action:
            info["act"] = describe_action(action)
        if rng.random() < config.p_big:
            info["big"] = np.full(300_000, self.t, dtype=np.float32)
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed_space()
        self.t = 0
        self.episode += 1
        if options:
            self.last_options = {k: (v.shape if isinstance(v, np.ndarray) else v) for k, v in options.items()}
            for _ in range(int(options.get("level", 0)) % 4):
                self.observation_space.sample()
        obs = self._obs()
        info = self._info(in_step=False)
        if options:
            info["opts"] = {k: v for k, v in options.items() if k != "bigmap"}
            if "bigmap" in options:
                info["bigmap_sum"] = float(np.sum(options["bigmap"]))
        if seed is not None and self.np_random.random() < 0.5:
            info["seeded"] = int(seed)
        return obs, info

    def step(self, action: Any):
        config = self.env_config
        rng = self.np_random
        self.t += 1
        obs = self._obs()
        terminated = rng.random() < self.p_term
        truncated = rng.random() < config.p_trunc or self.t >= config.max_len
        if rng.random() < config.p_both:
            terminated = truncated = True
        reward = self._reward()
        info = self._info(in_step=True, action=action)
        return obs, reward, self._flag(terminated), self._flag(truncated), info

    def probe(self, x: Any = None, k: int = 1) -> dict:
        return {"t": self.t, "x": x, "k": k, "episode": self.episode, "arr": np.arange(int(k) % 5, dtype=np.int32)}

    def big_probe(self, n: int = 100_000) -> np.ndarray:
        return np.full(int(n), float(self.t))

    def boom(self) -> None:
        raise KeyError(f"boom in {self.env_config.name}")


@dataclasses.dataclass(frozen=True)
class FuzzCase:
    """A vec env's options and its envs' configs, all drawn from ``seed`` by :func:`make_case`."""

    seed: int
    face: str            # "sb3" (ShmVecEnv vs DummyVecEnv) or "gym" (ShmVectorEnv vs SyncVectorEnv)
    start_method: str
    n_envs: int
    n_workers: int
    copy: bool
    mailbox_bytes: int
    autoreset_mode: str  # Gymnasium's face only
    n_steps: int
    obs_space: spaces.Space
    act_space: spaces.Space
    envs: tuple[EnvConfig, ...]

    def env_fns(self) -> list:
        return [functools.partial(FuzzEnv, config) for config in self.envs]

    def __str__(self) -> str:
        env = self.envs[0]
        autoreset = f" autoreset_mode={self.autoreset_mode}" if self.face == "gym" else ""
        text = (f"fuzz case seed={self.seed} ({self.face} face, {self.start_method}): {self.n_envs} envs on "
                f"{self.n_workers} workers, copy={self.copy}, mailbox_bytes={self.mailbox_bytes}{autoreset}; "
                f"observation_space={self.obs_space}, action_space={self.act_space}; rewards {env.reward_style}, "
                f"flags {env.flag_style}, {'loose' if env.loose_obs else 'exact'} observations, "
                f"info keys {[f.key for f in env.info_schema]}")
        return re.sub(r"\n\s*", " ", text)  # the spaces' multi-line arrays on one line


def face_and_method(seed: int) -> tuple[str, str]:
    """The face and start method of the case of ``seed`` (so that a seed alone replays a case)."""
    return ("sb3", "gym")[seed % 2], START_METHODS[(seed // 2) % len(START_METHODS)]


def make_case(seed: int) -> FuzzCase:
    """The case of ``seed``: its face and start method from :func:`face_and_method`, the rest random."""
    face, start_method = face_and_method(seed)
    gym_face = face == "gym"
    rng = np.random.default_rng(seed)
    # SB3's DummyVecEnv takes one level of Dict/Tuple and one action leaf; SyncVectorEnv cannot
    # split a batch of actions of an empty Dict/Tuple.
    obs_space = random_space(rng, max_depth=3 if gym_face else 1)
    act_space = random_space(rng, max_depth=2) if gym_face else random_leaf(rng)
    while gym_face and has_empty_composite(act_space):
        act_space = random_space(rng, max_depth=2)
    n_envs = int(rng.integers(1, 8))
    n_workers = int(rng.integers(1, min(3, n_envs) + 1))
    copy = bool(rng.random() < 0.5)
    mailbox_bytes = int((1 << 20, 1 << 20, 4096, 256, 16)[rng.integers(5)])
    autoreset_mode = ("NextStep", "SameStep", "Disabled")[rng.integers(3)]
    n_steps = int(rng.integers(60, 151))
    schema = random_info_schema(rng, gym_face)
    reward_style = REWARD_STYLES[rng.choice(len(REWARD_STYLES), p=REWARD_WEIGHTS)]
    flag_style = ("bool", "np", "mixed")[rng.choice(3, p=(0.6, 0.2, 0.2))]
    loose_obs = bool(rng.random() < 0.2)
    envs = tuple(
        EnvConfig(
            obs_space=obs_space, act_space=act_space, gym_face=gym_face, seed=int(rng.integers(2 ** 31)),
            name=f"env{i}", p_term=float(rng.choice((0.0, 0.02, 0.1, 0.3))),
            p_trunc=float(rng.choice((0.0, 0.02, 0.1, 0.3))), p_both=float(rng.choice((0.0, 0.0, 0.05))),
            max_len=int(rng.choice((3, 20, 1000))),
            info_style=("empty", "sparse", "dense", "reset_only")[rng.choice(4, p=(0.15, 0.35, 0.35, 0.15))],
            info_schema=schema, reward_style=reward_style, flag_style=flag_style, loose_obs=loose_obs,
            echo_action=bool(rng.random() < 0.5), p_big=float(rng.choice((0.0, 0.0, 0.0, 0.03))))
        for i in range(n_envs))
    return FuzzCase(seed=seed, face=face, start_method=start_method, n_envs=n_envs, n_workers=n_workers, copy=copy,
                    mailbox_bytes=mailbox_bytes, autoreset_mode=autoreset_mode, n_steps=n_steps,
                    obs_space=obs_space, act_space=act_space, envs=envs)
