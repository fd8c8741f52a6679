"""Comparison helpers shared by the test modules."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shmvec


# The directory that holds the shmvec these tests import: the checkout when installed editable,
# site-packages when installed from a wheel.
SHMVEC_ROOT = str(Path(shmvec.__file__).resolve().parents[1])
# tests/ (its importable test envs, for subprocesses and Ray actors) and the checkout above it.
TESTS_DIR = str(Path(__file__).resolve().parent)
REPO_ROOT = str(Path(__file__).resolve().parents[1])


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skips a test that needs ``modules`` where one is not installed (the runs on Python versions
    without a CPU build of torch here install neither SB3 nor torch), naming the missing ones."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}, which is not installed here "
                                                    "(the suite's full run installs it: pip install -e '.[test]')")


SB3 = needs("stable_baselines3")  # SB3 and so torch: the SB3 faces, the examples, the bench's policies


def pythonpath(*extra: str | Path) -> str:
    """PYTHONPATH for a subprocess that must import the shmvec these tests import (the checkout
    when installed editable, site-packages when installed from a wheel), then ``extra``.  Not the
    checkout itself: without an in-place build it has no compiled modules (``shmvec._sync``, ...)."""
    parts = [SHMVEC_ROOT, *map(str, extra), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


def assert_same(a: Any, b: Any, path: str = "value", ignore: frozenset[str] = frozenset(),
                strict_dtype: bool = False) -> None:
    """Asserts that two nested structures of dicts, tuples, lists, arrays and scalars are equal.

    Arrays are compared with ``np.array_equal`` (exact); with ``strict_dtype`` their dtypes
    and shapes must match as well.  Dict keys named in ``ignore`` are skipped (at any depth).
    """
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        keys_a = set(a) - ignore
        keys_b = set(b) - ignore
        assert keys_a == keys_b, f"{path}: keys {sorted(map(str, keys_a))} vs {sorted(map(str, keys_b))}"
        for key in a:
            if key not in ignore:
                assert_same(a[key], b[key], f"{path}[{key!r}]", ignore, strict_dtype)
        return
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        assert isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)), (
            f"{path}: {type(a).__name__} vs {type(b).__name__}")
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{k}]", ignore, strict_dtype)
        return
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        xa, xb = np.asarray(a), np.asarray(b)
        if strict_dtype:
            assert xa.dtype == xb.dtype, f"{path}: dtype {xa.dtype} vs {xb.dtype}"
        assert xa.shape == xb.shape, f"{path}: shape {xa.shape} vs {xb.shape}"
        assert np.array_equal(xa, xb), f"{path}: arrays differ\n{xa!r}\nvs\n{xb!r}"
        return
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)):
        assert (a == b) or (np.isnan(a) and np.isnan(b)), f"{path}: {a!r} != {b!r}"
        return
    assert a == b, f"{path}: {a!r} != {b!r}"


def type_tree(x: Any) -> Any:
    """The nested structure of ``x``'s types (assert_same compares values, not types)."""
    if isinstance(x, dict):
        return (type(x).__name__, [(type_tree(k), type_tree(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [type_tree(v) for v in x])
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape)
    return type(x).__name__


def close_all(*envs: Any) -> None:
    """Closes every env even if one close() raises; re-raises the first error."""
    first: BaseException | None = None
    for env in envs:
        if env is None:
            continue
        try:
            env.close()
        except BaseException as exc:  # noqa: BLE001
            first = first or exc
    if first is not None:
        raise first



POOL_INFO_KEYS = frozenset({"env_id", "pool_obs", "pool_action"})


def _own_infos(infos: list) -> list:
    return [{k: v for k, v in info.items() if k not in POOL_INFO_KEYS and k != "terminal_observation"}
            for info in infos]


def assert_pool_matches_dummy(env: Any, ref: Any, steps: int, n_actions: int, check_step: Any = None,
                              options: Any = None) -> int:
    """Seeds and resets both (with ``options`` set on both, if given), then steps ``env`` (an
    SB3-face pool with a full batch) and ``ref`` (a DummyVecEnv) with the same random actions,
    asserting equal obs, rewards, dones, infos (values and types; the pool's own info keys aside)
    and reset_infos; ``check_step(infos)`` adds checks.  Returns the episodes ended."""
    ref.seed(3)
    env.seed(3)
    if options is not None:
        ref.set_options(options)
        env.set_options(options)
    assert_same(env.reset(), ref.reset(), "reset", strict_dtype=True)
    assert_same(env.reset_infos, ref.reset_infos, "reset_infos after reset")
    rng = np.random.default_rng(0)
    ended = 0
    for t in range(steps):
        act = rng.integers(0, n_actions, size=env.num_envs)
        obs_r, rew_r, done_r, infos_r = ref.step(act)
        obs_s, rew_s, done_s, infos_s = env.step(act)
        assert_same(obs_s, obs_r, f"step {t} obs", strict_dtype=True)
        assert_same(rew_s, rew_r, f"step {t} rewards", strict_dtype=True)
        assert_same(done_s, done_r, f"step {t} dones", strict_dtype=True)
        assert_same(infos_s, infos_r, f"step {t} infos", ignore=POOL_INFO_KEYS)
        assert type_tree(_own_infos(infos_s)) == type_tree(_own_infos(infos_r)), f"step {t} info types"
        assert_same(env.reset_infos, ref.reset_infos, f"step {t} reset_infos")
        if check_step is not None:
            check_step(infos_s)
        ended += int(done_r.sum())
    return ended
