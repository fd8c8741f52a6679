"""Per-env arguments of a vec env, read the same way by every front-end: seeds, values, indices.

:func:`per_env_seeds` implements ``ShmVecEnv.seed()`` (an int, a list, or a
``numpy.random.SeedSequence``); :func:`seed_from_plain` reads back the plain value it returns
(for ``describe()``); :func:`spawn_seeds` derives independent seeds from a ``SeedSequence``;
:func:`gym_vector_seeds` is ``reset(seed=...)`` of the Gymnasium-style faces, :func:`gym_reset_mask`
their ``reset(options={"reset_mask": ...})``.

:func:`per_env_values` is the rule "one value per env (a list or tuple), or one for all"
(``set_attr``'s values, reset options); :func:`env_indices` is SB3's ``indices`` (None, an int,
or an iterable of ints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["spawn_seeds", "per_env_seeds", "seed_from_plain", "gym_vector_seeds", "per_env_values", "env_indices"]


def spawn_seeds(seed_seq: np.random.SeedSequence | int, n: int) -> list[int]:
    """``n`` independent 64-bit seeds derived from ``seed_seq`` as ``SeedSequence.spawn(n)`` would.

    Deterministic and free of side effects: the children are built from the sequence's entropy
    and spawn key, so calling this twice gives the same seeds (``SeedSequence.spawn`` itself
    would give new children each time).  Unlike SB3's ``seed + i``, runs with nearby seeds do
    not share envs' seeds.
    """
    if not isinstance(seed_seq, np.random.SeedSequence):
        seed_seq = np.random.SeedSequence(seed_seq)
    key = tuple(seed_seq.spawn_key)
    return [
        int(np.random.SeedSequence(seed_seq.entropy, spawn_key=key + (i,), pool_size=seed_seq.pool_size)
            .generate_state(1, np.uint64)[0])
        for i in range(n)
    ]


def per_env_seeds(seed: Any, n_envs: int) -> tuple[list[int], Any]:
    """The seeds ``ShmVecEnv.seed(seed)`` gives its envs, and ``seed`` as plain data (for describe()).

    - None: a random int ``s`` is drawn, then as for an int (as SB3 does);
    - an int ``s``: env i gets ``s + i`` (as SB3 does);
    - a sequence of ints: one per env (its length must be ``n_envs``);
    - a ``numpy.random.SeedSequence``: env i gets the i-th of :func:`spawn_seeds`.
    """
    if seed is None:
        seed = int(np.random.randint(0, np.iinfo(np.uint32).max, dtype=np.uint32))
    if isinstance(seed, np.random.SeedSequence):
        plain = {"entropy": seed.entropy, "spawn_key": list(seed.spawn_key), "pool_size": seed.pool_size}
        if not isinstance(seed.entropy, int):
            plain["entropy"] = [int(x) for x in seed.entropy]
        return spawn_seeds(seed, n_envs), {"seed_sequence": plain}
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        s = int(seed)
        return [s + i for i in range(n_envs)], s
    if isinstance(seed, Sequence) or isinstance(seed, np.ndarray):
        seeds = list(seed)
        if len(seeds) != n_envs:
            raise ValueError(f"seed() got {len(seeds)} seeds for {n_envs} envs: pass one seed per env, or one int")
        out = []
        for k, s in enumerate(seeds):
            if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer))):
                raise TypeError(f"seed[{k}] is {type(s).__name__}, not an int or None")
            out.append(None if s is None else int(s))
        return out, out
    raise TypeError(f"seed must be None, an int, a list of ints or a numpy.random.SeedSequence, not {type(seed).__name__}")


def seed_from_plain(plain: Any) -> Any:
    """The seed() argument a :func:`per_env_seeds` plain value stands for."""
    if isinstance(plain, Mapping) and "seed_sequence" in plain:
        ss = plain["seed_sequence"]
        return np.random.SeedSequence(ss["entropy"], spawn_key=tuple(ss["spawn_key"]), pool_size=ss["pool_size"])
    return plain


def gym_vector_seeds(seed: Any, num_envs: int) -> list:
    """reset's ``seed`` of the Gymnasium-style faces as one seed (or None) per env: None (unseeded),
    an int (env i gets ``seed + i``, as Gymnasium's vector envs) or a list of one per env."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        seeds = [int(seed) + i for i in range(num_envs)]
    else:
        seeds = list(seed)
        if len(seeds) != num_envs:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={num_envs} but got length={len(seeds)}."
            )
    # Checked here, as each env's reset would (Gymnasium's np_random), so that a bad seed breaks
    # nothing: raised in a worker, it would break the vector env.  numpy ints are taken as ints.
    for i, s in enumerate(seeds):
        if s is None:
            continue
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise gym.error.Error(f"Seed must be a python integer, actual type: {type(s)} (env {i})")
        seeds[i] = s = int(s)
        if s < 0:
            raise gym.error.Error(f"Seed must be greater or equal to zero, actual value: {s} (env {i})")
    return seeds


def gym_reset_mask(options: dict[str, Any] | None, num_envs: int) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """Gymnasium's ``reset(options={"reset_mask": mask})``: the options without it, and a copy of
    the mask (``reset_async``: the caller may change it before ``reset_wait``), checked with
    Gymnasium's own messages; ``(options, None)`` without one."""
    if options is None or "reset_mask" not in options:
        return options, None
    options = dict(options)
    mask = options.pop("reset_mask")
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not np.any(mask):
        raise ValueError(
            f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={mask}")
    return options, mask.copy()


def per_env_values(values: Any, n_envs: int, what: str = "values") -> list:
    """One value per env: ``values`` itself if it is a list or tuple (of ``n_envs``), otherwise
    ``values`` for every env (``set_attr``'s values, the options of a reset; as Gymnasium's
    ``VectorEnv.set_attr``).

    :raises ValueError: a list or tuple whose length is not ``n_envs``.
    """
    if not isinstance(values, (list, tuple)):
        return [values] * n_envs
    if len(values) != n_envs:
        raise ValueError(f"{what.capitalize()} must be a list or tuple with length equal to the number of environments "
                         f"(one entry per env), or one value (not a list) for all. Got `{len(values)}` {what} for "
                         f"{n_envs} environments, expected one per env.")
    return list(values)


def env_indices(indices: Any, n_envs: int) -> list[int]:
    """SB3's ``VecEnv._get_indices`` as a list: None (every env), an int, or an iterable of ints."""
    if indices is None:
        return list(range(n_envs))
    if isinstance(indices, int):
        return [indices]
    return list(indices)
