"""Differential fuzz test: shmvec and the reference vec envs on random spaces, infos and calls.

Each case (:func:`fuzzenvs.make_case`, drawn from one seed) runs ``ShmVecEnv`` against SB3's
``DummyVecEnv`` (SB3's face) or ``ShmVectorEnv`` against Gymnasium's ``SyncVectorEnv`` with the
same ``autoreset_mode`` (Gymnasium's face) in lockstep: the same factories, seeds, options and
actions, with resets (seeded or not, with options, masked in ``DISABLED`` mode), ``step`` and
``step_async``/``step_wait``, ``get_attr``, ``set_attr``, ``has_attr``, ``env_method``/``call``
(an env's exception included), ``env_is_wrapped`` and ``seed`` in between, on random ``indices``.
Every answer is compared to the last detail by :func:`first_difference`: observations, rewards,
dones or terminated/truncated, infos and ``reset_infos`` (types, dtypes, shapes, values, NaN equal
to NaN, key order, container types: a ``Dict`` batch is an ``OrderedDict`` on SB3's face, a
``dict`` on Gymnasium's), or the type of the exception both raise (a reset or step that both
refuse, as Gymnasium's info batching may, ends the case there).  ``helpers.assert_same``
compares values, not types, and cannot look into Gymnasium's object arrays of infos.

Accepted divergences, where shmvec documents another result than the reference's: the reference's
answer is mapped to shmvec's before the comparison.

- ``terminal_observation`` (SB3) and ``infos["final_obs"]`` (Gymnasium) are read back from the
  shared buffer, in the space's dtype, a scalar ``Box`` as ``Box.sample()`` gives it
  (docs/sb3.md: "Likewise ``terminal_observation`` is read back
  ..."); the references hand over the env's own object, which differs where the env returns
  looser types (:func:`fuzzenvs.loosen`).
- ``TimeLimit.truncated`` is a Python bool rebuilt from the shared flags (docs/sb3.md, "Infos");
  ``DummyVecEnv`` stores ``truncated and not terminated``, an ``np.bool_`` where the env's
  flags are numpy bools.
- Infos on shmvec's pickle path go through numpy's pickling: an ``np.longlong`` arrives as
  ``np.int64`` (``np.ulonglong``: ``np.uint64``), and a byte-swapped array that is not
  contiguous in native byte order (a contiguous one keeps its order), values equal (README,
  "Infos"; the comparison below sets byte order aside).

The default run is a fixed set of cases (seeds ``SHMVEC_FUZZ_SEED`` = 1000 and on), one test each,
named ``seed<seed>-<face>-<start method>``; the seed alone fixes the case.  Longer runs::

    SHMVEC_FUZZ_CONFIGS=2000 python -m pytest tests/frontends/test_fuzz.py -q -x
    SHMVEC_FUZZ_SEED=50000 SHMVEC_FUZZ_CONFIGS=2000 python -m pytest tests/frontends/test_fuzz.py -q -x

A failure names its case (seed, spaces, options) and the step; ``SHMVEC_FUZZ_SEED=<seed>
SHMVEC_FUZZ_CONFIGS=1`` replays that case alone.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.vec_env import DummyVecEnv

import fuzzenvs
from fuzzenvs import FuzzCase
from helpers import close_all
from shmvec import ShmVecEnv, ShmVectorEnv

FIRST_SEED = int(os.environ.get("SHMVEC_FUZZ_SEED", "1000"))
N_CASES = int(os.environ.get("SHMVEC_FUZZ_CONFIGS", "24"))
SEEDS = range(FIRST_SEED, FIRST_SEED + N_CASES)


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

def _type_name(x: Any) -> str:
    kind = type(x)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _short(x: Any) -> str:
    text = re.sub(r"\n\s*", " ", repr(x))  # arrays on one line (a str's repr has no newline)
    return text if len(text) <= 120 else text[:117] + "..."


def first_difference(got: Any, want: Any, path: str, pickled: bool = False) -> str | None:
    """The first difference between ``got`` (shmvec's) and ``want`` (the reference's), or None.

    Types must be the same at every depth (dict vs OrderedDict, list vs tuple, Python vs numpy
    scalars, numpy scalar types); arrays must have the same dtype and shape and equal values,
    NaN equal to NaN, object arrays compared element by element; dicts must have the same keys
    in the same order.  ``pickled`` (infos) accepts numpy's pickling: scalar types of the same
    dtype (``np.longlong`` vs ``np.int64``) and arrays that differ in byte order only.
    """
    if type(got) is not type(want):
        aliases = pickled and isinstance(got, np.generic) and isinstance(want, np.generic) and got.dtype == want.dtype
        if not aliases:
            return f"{path}: {_type_name(got)} vs {_type_name(want)} ({_short(got)} vs {_short(want)})"
    if isinstance(want, np.ndarray):
        same_dtype = got.dtype == want.dtype or (pickled and got.dtype == want.dtype.newbyteorder("="))
        if not same_dtype or got.shape != want.shape:
            return f"{path}: array {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
        if want.dtype == object:
            for index in np.ndindex(want.shape):
                diff = first_difference(got[index], want[index], f"{path}[{index}]", pickled)
                if diff is not None:
                    return diff
            return None
        if not np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"):
            return f"{path}: {_short(got)} vs {_short(want)}"
        return None
    if isinstance(want, np.generic):
        if not np.array_equal(np.asarray(got), np.asarray(want), equal_nan=want.dtype.kind in "fc"):
            return f"{path}: {got!r} vs {want!r}"
        return None
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{path}: keys {list(got)} vs {list(want)}"
        for key in want:
            diff = first_difference(got[key], want[key], f"{path}[{key!r}]", pickled)
            if diff is not None:
                return diff
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{path}: length {len(got)} vs {len(want)}"
        for k, (x, y) in enumerate(zip(got, want)):
            diff = first_difference(x, y, f"{path}[{k}]", pickled)
            if diff is not None:
                return diff
        return None
    if isinstance(want, float):
        if not (got == want or (math.isnan(got) and math.isnan(want))):
            return f"{path}: {got!r} vs {want!r}"
        return None
    if not got == want:
        return f"{path}: {_short(got)} vs {_short(want)}"
    return None


# ---------------------------------------------------------------------------------------------
# The references' answers as shmvec documents them (the accepted divergences, above)
# ---------------------------------------------------------------------------------------------

def _as_documented_sb3_infos(infos: list[dict], dones: np.ndarray, obs_space: Any) -> list[dict]:
    for info, done in zip(infos, dones):
        info["TimeLimit.truncated"] = bool(info["TimeLimit.truncated"])
        if done:
            info["terminal_observation"] = fuzzenvs.as_read_back(obs_space, info["terminal_observation"])
    return infos


def _as_documented_gym_infos(infos: dict, obs_space: Any) -> dict:
    if "final_obs" in infos:
        for k in np.flatnonzero(infos["_final_obs"]):
            infos["final_obs"][k] = fuzzenvs.as_read_back(obs_space, infos["final_obs"][k])
    return infos


# ---------------------------------------------------------------------------------------------
# Lockstep drivers
# ---------------------------------------------------------------------------------------------

class BothRaised(Exception):
    """Both vec envs raised the same type of exception in a reset or step: the case ends there."""


class Lockstep:
    """The reference and shmvec's vec env of one case, called alike; every answer compared."""

    RARE_CALL_P = 0.06
    RESET_P = 0.02

    def __init__(self, case: FuzzCase, ref: Any, env: Any) -> None:
        self.case = case
        self.ref = ref
        self.env = env
        self.rng = np.random.default_rng((case.seed, 1))  # the calls; the case has its own
        self.where = "construction"

    def fail(self, message: str, cause: BaseException | None = None) -> NoReturn:
        """Fails naming the case, the step or call, and how to replay the case alone."""
        replay = f"SHMVEC_FUZZ_SEED={self.case.seed} SHMVEC_FUZZ_CONFIGS=1 python -m pytest tests/frontends/test_fuzz.py"
        raise AssertionError(f"{self.case}\n  at {self.where}: {message}\n  replay: {replay}") from cause

    def check(self, what: str, got: Any, want: Any, pickled: bool = False) -> None:
        diff = first_difference(got, want, what, pickled)
        if diff is not None:
            self.fail(diff)

    def both(self, what: str, call: Callable[[Any], Any]) -> tuple[Any, Any] | None:
        """``(shmvec's, the reference's)`` results of ``call(venv)``, or None where both raised
        the same type of exception; a failure where only one raised."""
        results, errors = [], []
        try:
            for venv in (self.env, self.ref):
                try:
                    results.append(call(venv))
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - compared below
                    results.append(None)
                    errors.append(exc)
            got_exc, want_exc = errors
            if got_exc is None and want_exc is None:
                return results[0], results[1]
            if got_exc is not None and want_exc is not None and isinstance(got_exc, type(want_exc)):
                return None
            self.fail(f"{what}: shmvec raised {got_exc!r}, the reference raised {want_exc!r}", cause=got_exc)
        finally:
            # An exception's traceback holds this frame, and this frame the exceptions: without
            # this, they would live (and keep the vec env's frames and buffers) until a GC pass.
            errors.clear()

    def indices(self) -> Any:
        """``indices`` for SB3's calls: None, an int (negative too), a list, repeats, out of range."""
        n = self.case.n_envs
        kind = self.rng.integers(6)
        if kind == 0:
            return None
        if kind == 1:
            return int(self.rng.integers(-n, n))
        if kind == 2:
            return [int(i) for i in self.rng.integers(-n, n, size=int(self.rng.integers(1, 4)))]
        if kind == 3:
            return list(range(n))[::-1]
        if kind == 4:
            return [0, 0]
        return [n]  # out of range: both raise IndexError

    def one_options(self) -> dict:
        rng = self.rng
        options: dict[str, Any] = {}
        if rng.random() < 0.8:
            options["level"] = int(rng.integers(0, 10))
        if rng.random() < 0.3:
            options["tag"] = f"t{int(rng.integers(100))}"
        if rng.random() < 0.2:
            options["arr"] = np.arange(int(rng.integers(0, 5)), dtype=np.float32)
        if rng.random() < 0.08:
            options["bigmap"] = np.ones((300, 300))  # 720 kB: more than a pipe's or a mailbox's buffer
        return options

    def run(self) -> None:
        self.check("observation_space", self.env.observation_space, self.ref.observation_space)
        self.check("action_space", self.env.action_space, self.ref.action_space)
        self.check("num_envs", self.env.num_envs, self.ref.num_envs)
        try:
            self.reset("first reset")
            for t in range(self.case.n_steps):
                self.where = f"step {t}"
                self.step()
                u = self.rng.random()
                if u < self.RARE_CALL_P:
                    self.rare_call()
                elif u < self.RARE_CALL_P + self.RESET_P:
                    self.reset(f"reset after step {t}")
        except BothRaised:
            return

    def reset(self, where: str) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def rare_call(self) -> None:
        raise NotImplementedError


def _step_async_wait(venv: Any, actions: Any) -> Any:
    venv.step_async(actions)
    return venv.step_wait()


class SB3Lockstep(Lockstep):
    """``ShmVecEnv`` against ``DummyVecEnv``."""

    def __init__(self, case: FuzzCase, ref: DummyVecEnv, env: ShmVecEnv) -> None:
        super().__init__(case, ref, env)
        self.actions = batch_space(case.act_space, case.n_envs)
        self.actions.seed(int(self.rng.integers(2 ** 31)))

    def reset(self, where: str) -> None:
        self.where = where
        rng = self.rng
        if rng.random() < 0.7:
            seed = int(rng.choice([0, 1, 12345, 2 ** 32 - 1, 2 ** 40]))
            seeds = self.both(f"seed({seed})", lambda venv: venv.seed(seed))
            if seeds is not None:
                self.check("seed()", *seeds)
        if rng.random() < 0.4:
            options: Any = self.one_options()
            if rng.random() < 0.4:
                options = [self.one_options() for _ in range(self.case.n_envs)]
            self.both("set_options()", lambda venv: venv.set_options(options))
        obs = self.both("reset()", lambda venv: venv.reset())
        if obs is None:
            raise BothRaised
        self.check("obs", *obs)
        self.check("reset_infos", self.env.reset_infos, self.ref.reset_infos, pickled=True)

    def step(self) -> None:
        actions = self.actions.sample()
        if self.rng.random() < 0.1:
            out = self.both("step_async()/step_wait()", functools.partial(_step_async_wait, actions=actions))
        else:
            out = self.both("step()", lambda venv: venv.step(actions))
        if out is None:
            raise BothRaised
        (obs, rewards, dones, infos), (ref_obs, ref_rewards, ref_dones, ref_infos) = out
        self.check("obs", obs, ref_obs)
        self.check("rewards", rewards, ref_rewards)
        self.check("dones", dones, ref_dones)
        self.check("infos", infos, _as_documented_sb3_infos(ref_infos, ref_dones, self.case.obs_space), pickled=True)
        self.check("reset_infos", self.env.reset_infos, self.ref.reset_infos, pickled=True)

    def rare_call(self) -> None:
        rng = self.rng
        indices = self.indices()
        kind = rng.integers(7)
        if kind == 0:
            name = str(rng.choice(["t", "episode", "last_options", "p_term", "observation_space", "np_random_seed",
                                   "env_config", "nonexistent"]))
            what = f"get_attr({name!r}, {indices})"
            call: Callable[[Any], Any] = lambda venv: venv.get_attr(name, indices)
        elif kind == 1:
            x = (None, 3, "s", np.arange(3), {"q": 1.5})[rng.integers(5)]
            k = int(rng.integers(0, 7))
            what = f"env_method('probe', {x!r}, indices={indices}, k={k})"
            call = lambda venv: venv.env_method("probe", x, indices=indices, k=k)
        elif kind == 2:
            name = str(rng.choice(["t", "probe", "nonexistent"]))
            what = f"has_attr({name!r})"
            call = lambda venv: venv.has_attr(name)
        elif kind == 3:
            value = float(rng.choice([0.0, 0.2, 0.5]))
            what = f"set_attr('p_term', {value}, {indices}), get_attr('p_term')"
            call = lambda venv: (venv.set_attr("p_term", value, indices), venv.get_attr("p_term"))
        elif kind == 4:
            what = f"env_method('boom', indices={indices})"
            call = lambda venv: venv.env_method("boom", indices=indices)
        elif kind == 5:
            what = f"env_is_wrapped(TimeLimit, {indices})"
            call = lambda venv: venv.env_is_wrapped(TimeLimit, indices)
        else:
            n = int(rng.choice([10, 100_000]))
            what = f"env_method('big_probe', {n}, indices={indices})"
            call = lambda venv: venv.env_method("big_probe", n, indices=indices)
        results = self.both(what, call)
        if results is not None:
            self.check(what, *results)


class GymLockstep(Lockstep):
    """``ShmVectorEnv`` against ``SyncVectorEnv`` (same ``autoreset_mode``)."""

    RARE_CALL_P = 0.05

    def __init__(self, case: FuzzCase, ref: SyncVectorEnv, env: ShmVectorEnv) -> None:
        super().__init__(case, ref, env)
        self.ref.action_space.seed(int(self.rng.integers(2 ** 31)))
        self.disabled = AutoresetMode(case.autoreset_mode) == AutoresetMode.DISABLED

    def run(self) -> None:
        for name in ("single_observation_space", "single_action_space"):
            self.check(name, getattr(self.env, name), getattr(self.ref, name))
        super().run()

    def seed_arg(self) -> Any:
        u = self.rng.random()
        if u < 0.3:
            return None
        if u < 0.7:
            return int(self.rng.integers(0, 2 ** 31))
        return [None if self.rng.random() < 0.3 else int(self.rng.integers(0, 1000)) for _ in range(self.case.n_envs)]

    def reset(self, where: str, mask: np.ndarray | None = None) -> None:
        self.where = where
        seed = self.seed_arg()
        options = self.one_options() if self.rng.random() < 0.4 else None
        if mask is not None:
            options = dict(options or {}, reset_mask=mask)

        def reset(venv: Any) -> Any:  # each its own dict: SyncVectorEnv pops reset_mask out of it
            return venv.reset(seed=seed, options=None if options is None else dict(options))

        out = self.both(f"reset(seed={seed}, options with keys {sorted(options or ())})", reset)
        if out is None:
            raise BothRaised
        (obs, infos), (ref_obs, ref_infos) = out
        self.check("obs", obs, ref_obs)
        self.check("infos", infos, ref_infos, pickled=True)

    def step(self) -> None:
        actions = self.ref.action_space.sample()
        out = self.both("step()", lambda venv: venv.step(actions))
        if out is None:
            raise BothRaised
        got, want = out
        for k, what in enumerate(("obs", "rewards", "terminated", "truncated")):
            self.check(what, got[k], want[k])
        self.check("infos", got[4], _as_documented_gym_infos(want[4], self.case.obs_space), pickled=True)
        ended = want[2] | want[3]
        if self.disabled and ended.any():
            self.reset(f"{self.where}, masked reset", mask=ended)

    def rare_call(self) -> None:
        rng = self.rng
        kind = rng.integers(5)
        if kind == 0:
            name = str(rng.choice(["t", "episode", "last_options", "env_config", "np_random_seed", "nonexistent"]))
            what = f"get_attr({name!r})"
            call: Callable[[Any], Any] = lambda venv: venv.get_attr(name)
        elif kind == 1:
            x = (None, 3, "s", np.arange(3))[rng.integers(4)]
            what = f"call('probe', {x!r}, k=2)"
            call = lambda venv: venv.call("probe", x, k=2)
        elif kind == 2:
            values: Any = 0.1
            if rng.random() < 0.5:
                values = [float(rng.choice([0.0, 0.3])) for _ in range(self.case.n_envs)]
            what = f"set_attr('p_term', {values}), get_attr('p_term')"
            call = lambda venv: (venv.set_attr("p_term", values), venv.get_attr("p_term"))
        elif kind == 3:
            what = "np_random_seed"
            call = lambda venv: venv.np_random_seed
        else:
            what = "call('boom')"
            call = lambda venv: venv.call("boom")
        results = self.both(what, call)
        if results is not None:
            self.check(what, *results)


# ---------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [pytest.param(s, id="seed{}-{}-{}".format(s, *fuzzenvs.face_and_method(s)))
                                  for s in SEEDS])
def test_fuzz_case_matches_reference(seed: int) -> None:
    case = fuzzenvs.make_case(seed)
    fns = case.env_fns()
    options = {"n_workers": case.n_workers, "start_method": case.start_method, "copy": case.copy,
               "mailbox_bytes": case.mailbox_bytes}
    ref = env = None
    try:
        if case.face == "sb3":
            ref = DummyVecEnv(fns)
            env = ShmVecEnv(fns, **options)
            SB3Lockstep(case, ref, env).run()
        else:
            mode = AutoresetMode(case.autoreset_mode)
            ref = SyncVectorEnv(fns, copy=case.copy, autoreset_mode=mode)
            env = ShmVectorEnv(fns, autoreset_mode=mode, **options)
            GymLockstep(case, ref, env).run()
    finally:
        close_all(env, ref)
