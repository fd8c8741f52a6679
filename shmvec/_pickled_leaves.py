"""Leaves without a fixed size: their values travel pickled, beside the infos.

``shmvec._layout.space_leaves`` marks a leaf whose space has no fixed size (``Text``,
``Sequence``, ``Graph``, ``OneOf``, any other ``Space`` subclass) as pickled: it gets no buffer in
the block.  Its values go where the infos go, in the messages of :mod:`shmvec._protocol`:

- Observations, worker -> parent.  With any pickled observation leaf, the result of worker w for
  STEP and RESET is ``(items, values, terminal)`` in place of ``items``: ``values[k]`` is the list
  of pickled leaf k's values of every env of the slice after the command (a masked reset sends the
  others' too: the parent gets objects of its own, a new batch never shares one with an old
  batch), ``terminal`` a list of ``(i, [value of each leaf])`` for the envs that ended in a
  SAME_STEP step (their terminal observation).  It is encoded as a result always is (the
  worker's ``_put_result``): the info codec when it carries every value (a ``Text``'s ``str``, a
  ``Sequence``'s tuple of arrays), else pickled; in the mailbox, or through the pipe when larger
  (protocol steps 5, 6b and 8).  The parent's :meth:`PickledLeaves.take_all` keeps the values, one
  slot per env, and hands the items on.
- Actions, parent -> worker.  With any pickled action leaf, before each STEP the parent pickles
  the slice's values of every pickled action leaf into mailbox w and ARG_LEN[w] (ARG_IN_PIPE when
  larger: sent through the pipe once posted, as a reset's arguments, protocol step 1:
  ``shmvec._actions.ActionWriter`` hands them to worker w's link, ``shmvec._link.Link.put_arg``); the worker reads them first
  (:meth:`WorkerLeaves.load_actions`), before it steps and before it writes its result into the
  same mailbox.

Ownership is the protocol's: the mailbox and ARG_LEN pass to the worker with CMD_SEQ and come back
with PENDING.  Leaves with a fixed size stay in their buffers (a ``Dict`` of an image ``Box`` and
a ``Text`` keeps its image in shared memory).  In each process, ``shmvec._layout.Views`` holds a
list of values (one slot per env) in place of a pickled leaf's buffer: the gathers and scatters of
``shmvec._layout`` read and write it like a buffer, and the classes here fill it from the messages
(:meth:`PickledLeaves.take_all`, :meth:`WorkerLeaves.load_actions`) and build the messages from it.
Both sides order the pickled leaves by ``Layout.obs_pickled``/``act_pickled``.  Plain spaces pay
for none of this: each side decides once, at start-up, whether its layout has pickled leaves.

A batch of a pickled leaf is Gymnasium's ``concatenate`` of it, a tuple of the envs' values, for
``ShmVectorEnv``; for ``ShmVecEnv`` it is :func:`stack_values`, ``SubprocVecEnv``'s ``np.stack``.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from shmvec._errors import SpaceError
from shmvec._layout import Layout, Path, Views


def stack_values(values: list) -> np.ndarray:
    """SB3's batch of a pickled leaf: ``np.stack`` of the envs' values, as ``SubprocVecEnv`` stacks
    them (a ``Text`` batch is a ``<U`` array); where numpy cannot stack them (``Sequence`` values of
    different lengths, ``Graph`` or ``OneOf`` values: ``SubprocVecEnv`` raises), a 1-D object array
    holding each env's value."""
    try:
        return np.stack(values)
    except (ValueError, TypeError):
        out = np.empty(len(values), dtype=object)
        for k, value in enumerate(values):  # one by one: a tuple value must stay one element
            out[k] = value
        return out


def leaf_value(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def per_env_actions(batch: Any, n_envs: int, path: Path) -> list:
    """The ``n_envs`` values of a pickled action leaf's batch (a tuple, as Gymnasium batches it, a
    list, or an array whose first axis is the env).

    :raises ValueError: not a sequence of ``n_envs`` values (a ``str`` is refused: one per env).
    """
    where = "".join(f"[{k!r}]" for k in path)
    if isinstance(batch, (str, bytes, dict)) or not hasattr(batch, "__len__") or not hasattr(batch, "__getitem__"):
        raise ValueError(
            f"actions{where} is {type(batch).__name__}; expected a sequence of {n_envs} values, one per env "
            "(a tuple, a list or an array)")
    if len(batch) != n_envs:
        raise ValueError(f"actions{where} has {len(batch)} values; expected {n_envs}, one per env")
    return [batch[i] for i in range(n_envs)]


def pickled_leaves(layout: Layout, views: Views, slices: list[range], restart: bool) -> "PickledLeaves | None":
    """The parent's side for ``layout`` (its lists are those of ``views``); None when every leaf has a
    fixed size.

    :raises SpaceError: leaves without a fixed size and ``on_failure="restart"``: a restart
        rebuilds a worker's slice from shared memory, where these values are not.
    """
    if not (layout.obs_pickled or layout.act_pickled):
        return None
    if restart:
        raise SpaceError(
            f"on_failure='restart' cannot restart envs whose spaces have no fixed size (observation_space "
            f"{layout.observation_space}, action_space {layout.action_space}): their values travel pickled and a "
            "restart does not carry them. Use on_failure='raise', or spaces of fixed size (Box, Discrete, ...).")
    return PickledLeaves(layout, views, slices)


class PickledLeaves:
    """The parent's side: the pickled observation leaves' values (one slot per env, for the
    observations and the terminal observations) and the pickled action leaves' messages."""

    def __init__(self, layout: Layout, views: Views, slices: list[range]) -> None:
        self.slices = slices
        self.n_envs = layout.n_envs
        self.obs = [views.obs[path] for path in layout.obs_pickled]  # one list of values per leaf
        self.term_obs = [views.term_obs[path] for path in layout.obs_pickled]
        self.act_paths = list(layout.act_pickled)

    def take_all(self, results: list) -> list[list]:
        """The workers' result messages of a command (one per worker, in order): keeps their leaf
        values, returns their items.  A plain list (no values: a command other than STEP and RESET,
        or an error) is taken as it is."""
        out = []
        for sl, message in zip(self.slices, results):
            if type(message) is not tuple:
                out.append(message)
                continue
            items, values, terminal = message
            for slots, vals in zip(self.obs, values):
                slots[sl.start:sl.stop] = vals
            for i, vals in terminal:
                for slots, value in zip(self.term_obs, vals):
                    slots[i] = value
            out.append(items)
        return out

    def for_actions(self, links: Any) -> tuple | None:
        """``ActionWriter``'s ``pickled`` argument: ``(action_messages, links)`` (the engine's
        :class:`shmvec._link.Links`, which put each worker's message into its mailbox or leave
        it for the pipe), or None when no action leaf travels pickled."""
        return (self.action_messages, links) if self.act_paths else None

    def action_messages(self, actions: Any) -> list[bytes]:
        """Per worker, the pickle of its envs' values of every pickled action leaf; raises before
        anything is written or sent.

        :raises ValueError: a leaf's batch is not one value per env.
        :raises pickle.PicklingError, TypeError, ...: a value does not pickle (a note names the env).
        """
        per_leaf = [per_env_actions(leaf_value(actions, path), self.n_envs, path) for path in self.act_paths]
        out = []
        for sl in self.slices:
            part = [values[sl.start:sl.stop] for values in per_leaf]
            try:
                out.append(pickle.dumps(part, protocol=5))
            except Exception as exc:
                for path, values in zip(self.act_paths, per_leaf):
                    for i in sl:
                        try:
                            pickle.dumps(values[i], protocol=5)
                        except Exception:
                            where = "".join(f"[{k!r}]" for k in path)
                            exc.add_note(f"shmvec: the action{where} of env {i} does not pickle (the values of a "
                                         "space without a fixed size travel to the workers pickled).")
                            raise exc from None
                raise
        return out


class WorkerLeaves:
    """A worker's side: the lists of its ``views`` (one slot per env of the vec env, its own slice
    used), its result messages, its step's actions."""

    def __init__(self, layout: Layout, views: Views, start: int, stop: int, same_step: bool) -> None:
        self.start, self.stop = start, stop
        self.same_step = same_step  # SAME_STEP autoreset: a step writes the terminal observations
        self.obs = [views.obs[path] for path in layout.obs_pickled]  # one list of values per leaf
        self.term_obs = [views.term_obs[path] for path in layout.obs_pickled]
        self.act = [views.act[path] for path in layout.act_pickled]

    def message(self, items: list, terminated: np.ndarray | None, truncated: np.ndarray | None) -> tuple:
        """The result of a STEP or RESET: ``(items, values of the slice, terminal values)``; the
        flags (a STEP's, published and still this worker's) say which envs ended, None for a RESET."""
        start, stop = self.start, self.stop
        values = [slots[start:stop] for slots in self.obs]
        terminal = []
        if self.same_step and terminated is not None:
            ended = np.flatnonzero(terminated[start:stop] | truncated[start:stop]) + start  # type: ignore[index]
            terminal = [(i, [slots[i] for slots in self.term_obs]) for i in ended.tolist()]
        return items, values, terminal

    def per_env(self, message: tuple) -> list[tuple[int, Any]]:
        """``(env index, part)`` for each part of ``message`` (to name the env of a value that does
        not pickle)."""
        items, values, terminal = message
        parts: list[tuple[int, Any]] = [(item[0], item) for item in items]
        parts += [(self.start + j, value) for vals in values for j, value in enumerate(vals)]
        parts += list(terminal)
        return parts

    def load_actions(self, data: bytes | memoryview) -> None:
        """Takes a STEP's pickled action values (``PickledLeaves.action_messages``) into the slots."""
        start, stop = self.start, self.stop
        for slots, values in zip(self.act, pickle.loads(data)):
            slots[start:stop] = values
