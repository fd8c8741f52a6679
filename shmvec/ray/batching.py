"""What crosses Ray each step, in batches: actions split per actor, results and infos joined.

Each actor holds a contiguous slice of the envs (``slices[k]``), so the driver's batch is the
actors' batches end to end:

- actions: :func:`split_actions` checks the batch once (shape, dtype, invalid values) against
  the action space and cuts it into one part per slice, before any actor is sent anything;
- observations: :func:`concatenator` joins the actors' parts, per leaf of the observation space
  (rows of a batch are taken by :func:`shmvec._frontend.batch_rows`, as every face does);
- infos of a step (RayShmVecEnv): only those that say more than ``{"TimeLimit.truncated":
  False}`` travel, with the reset infos of envs that finished, as one pickled list per actor
  (:func:`pack_step_infos` in the actor, :func:`merge_step_infos` in the driver);
- infos of a pool batch (RayShmEnvPool): each row's Gymnasium info as a plain dict plus its
  own unbatched (info, reset info), only for rows that hold something (:func:`pack_pool_rows`,
  :func:`unpack_pool_rows`).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec._actions import exact_cast, leaf_check, rows_reshaped
from shmvec._containers import assembler, children
from shmvec._pickling import dumps  # pickle, or cloudpickle for classes of __main__

__all__ = ["PLAIN_INFO_KEY", "split_actions", "concatenator", "row_infos", "pack_step_infos", "merge_step_infos",
           "pack_pool_rows", "unpack_pool_rows"]

# An info that says nothing beyond this is not sent; the driver rebuilds it.
PLAIN_INFO_KEY = "TimeLimit.truncated"


def split_actions(space: spaces.Space, actions: Any, n_envs: int, slices: list[range], path: str = "",
                  policy: str = "ignore", keys: tuple = ()) -> list:
    """The actions of each actor's slice, per leaf of ``space``; checks shape and dtype once here."""
    kids = children(space)
    if kids is not None:  # a container (shmvec._containers): each actor's part, built of its children's
        per_child = [split_actions(sub, actions[key], n_envs, slices, f"{path}[{key!r}]", policy, (*keys, key))
                     for key, sub in kids]
        build = assembler(space)
        return [build([parts[k] for parts in per_child]) for k in range(len(slices))]
    arr = np.asarray(actions)
    shape = (n_envs, *(space.shape or ()))
    if arr.shape != shape:
        reshaped = rows_reshaped(arr, n_envs, tuple(space.shape or ()))
        if reshaped is None:  # a transposed batch, too: never reshaped into a mix of envs' actions
            raise ValueError(
                f"actions{path} have shape {arr.shape}; expected {shape} "
                f"(n_envs={n_envs} x the action space's {space.shape}; one row per env, first)"
            )
        arr = reshaped
    # Checked here, before any actor is sent anything, as a local ShmVecEnv checks: whole floats
    # and integers that fit are taken for an integer space; narrowing never wraps.
    if space.dtype is not None:
        arr = exact_cast(arr, space.dtype, keys)
    check = leaf_check(space, keys, policy) if policy != "ignore" else None
    if check is not None:
        check(arr)  # InvalidActionError (global env indices) before any actor is sent anything
    return [arr[sl.start:sl.stop] for sl in slices]


def concatenator(space: spaces.Space, top_dict: type = dict) -> Callable[[list], Any]:
    """A function joining the actors' observations (in order) into one batch, per leaf of ``space``;
    a top-level ``Dict``'s batch is a ``top_dict`` (SB3's vec envs return an ``OrderedDict``)."""
    kids = children(space)
    if kids is not None:  # a container (shmvec._containers): its children's batches, joined, put together
        subs = [(key, concatenator(sub)) for key, sub in kids]
        build = assembler(space, top_dict)
        return lambda parts: build([f([p[key] for p in parts]) for key, f in subs])
    return np.concatenate


def row_infos(infos: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Gymnasium-style batched infos (arrays with ``_key`` masks) as one plain dict per row.

    ``env_id`` is left out; rebuilding with ``VectorEnv._add_info`` row by row gives the batch back.
    """
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id":
            continue
        mask = infos.get(f"_{key}")
        sub = row_infos(value, n) if isinstance(value, dict) else None
        plain_bool = sub is None and isinstance(value, np.ndarray) and value.dtype == np.bool_
        for k in range(n):
            if mask is None or mask[k]:
                # a bool goes back as bool: _add_info batches np.bool_ into an object array
                out[k][key] = sub[k] if sub is not None else bool(value[k]) if plain_bool else value[k]
    return out


def pack_step_infos(infos: list[dict[str, Any]], dones: np.ndarray, reset_infos: list[dict[str, Any]]) -> bytes:
    """In the actor: the infos of a step that say more than the plain one, and the reset infos
    of the envs that finished, as ``(local env, info)`` lists in one pickle (empty: none)."""
    extra = []
    for i, info in enumerate(infos):
        if len(info) != 1 or info.get(PLAIN_INFO_KEY) is not False:
            extra.append((i, info))
    resets = [(i, reset_infos[i]) for i in np.flatnonzero(dones).tolist() if reset_infos[i]]
    return dumps((extra, resets)) if extra or resets else b""


def merge_step_infos(slices: list[range], results: list[tuple], reset_infos: list[dict[str, Any]]) -> list[dict]:
    """In the driver: every env's info of the step, from each actor's ``(obs, rewards, dones,
    payload)`` (the payload as :func:`pack_step_infos` made it, or already unpickled); updates
    ``reset_infos`` of the envs that finished."""
    infos: list[dict[str, Any]] = []
    for sl, (_, _, dones, payload) in zip(slices, results):
        start = sl.start
        infos.extend({PLAIN_INFO_KEY: False} for _ in sl)
        for i in np.flatnonzero(dones).tolist():
            reset_infos[start + i] = {}
        if payload:
            extra, resets = pickle.loads(payload) if isinstance(payload, bytes) else payload
            for i, info in extra:
                infos[start + i] = info
            for i, info in resets:
                reset_infos[start + i] = info
    return infos


def pack_pool_rows(infos: dict[str, Any], n: int, own: list[tuple]) -> bytes:
    """In the actor: a pool batch's rows that hold something, as ``(row, Gymnasium info as a
    plain dict, the row's own (info, reset info))`` in one pickle (empty: none)."""
    found = [(k, info, own[k]) for k, info in enumerate(row_infos(infos, n)) if info or own[k][0] or own[k][1]]
    return dumps(found) if found else b""


def unpack_pool_rows(payload: bytes, n: int) -> tuple[list[dict[str, Any] | None], list[tuple]]:
    """In the driver: (each row's info or None, each row's own (info, reset info)) of a batch of
    ``n`` rows from :func:`pack_pool_rows`'s payload."""
    infos: list[dict[str, Any] | None] = [None] * n
    raw: list[tuple] = [({}, None)] * n  # each row's own (info, reset info): ShmEnvPool.row_infos
    for row, info, own in (pickle.loads(payload) if payload else ()):
        infos[row], raw[row] = info, own
    return infos, raw
