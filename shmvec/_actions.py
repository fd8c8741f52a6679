"""Actions into the shared buffers, checked in the parent before anything reaches a worker.

:class:`ActionWriter` takes the batched form (an array per leaf, nested like the space) or, for
a ``Dict`` or ``Tuple`` action space, a sequence of per-env actions as ``DummyVecEnv`` takes them
(:func:`is_per_env`), stacked leaf by leaf; it checks each leaf's shape and dtype, then the
values that an env must not receive:

- ``Box`` of floats: no NaN (``inf`` and values outside the bounds pass: many
  envs clip, and SAC-like policies may step past the bounds on purpose);
- ``Discrete``: ``start <= a < start + n``;
- ``MultiDiscrete``: ``start <= a < start + nvec``, element by element;
- ``MultiBinary``: 0 or 1.

What happens to invalid actions is the vec env's ``invalid_actions`` option:
``"raise"`` (default: :class:`InvalidActionError`, a ``ValueError`` naming the
env indices, and nothing is sent), ``"warn"`` (:class:`InvalidActionWarning`,
then the actions are sent as they are) or ``"ignore"`` (no check at all).

These rules are written once, here, for every face: :class:`ActionWriter` (the SB3 and Gymnasium
faces, ``ShmMultiAgentVecEnv``'s stacked rows), and :func:`leaf_batch` with :func:`leaf_check` for
``ShmParallelEnv``'s batch of each agent (named as ``actions['agent_0']``), so that a batch one
face refuses (floats that are not whole numbers for an integer space, one value for every env) no
face truncates or broadcasts; :func:`exact_cast` is the cast rule alone (``ShmEnvPool``'s rows go
through :meth:`ActionWriter.write_rows`, the Ray faces' batch through ``exact_cast`` before it is split).

The usual batch (an ndarray of the leaf's shape and dtype) is checked and copied
in one C loop (``shmvec._rows.copy_actions``, about 0.15 us for 64 envs; the
arguments per leaf come from :func:`make_fast_copies`).  Anything else, and any
batch that fails, takes the Python path: one or two numpy reductions over the
batch (about 2 us for 64 envs), and the indices of the faulty envs are only
computed once a check has failed.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from shmvec._containers import batched_form, children, is_keyed
from shmvec._errors import InvalidActionError, InvalidActionWarning
from shmvec._rows import ACTIONS_COPY, ACTIONS_NO_NAN, ACTIONS_RANGE, copy_actions

INVALID_ACTIONS = ("raise", "warn", "ignore")

Check = Callable[[np.ndarray], None]
_UNSIGNED = {n: np.dtype(f"u{n}") for n in (1, 2, 4, 8)}


def subspace(space: spaces.Space, path: tuple) -> spaces.Space:
    for key in path:
        space = space[key]
    return space


def make_action_checks(action_space: spaces.Space, paths: list[tuple], policy: str) -> dict[tuple, Check]:
    """One check per leaf path that needs one; empty with ``policy="ignore"``.

    A check takes the batch of one leaf, shaped ``(n_envs, *leaf_shape)``, and
    raises :class:`InvalidActionError` (or warns) naming the envs whose action is invalid.
    """
    if policy not in INVALID_ACTIONS:
        raise ValueError(f"invalid_actions must be one of {INVALID_ACTIONS}, got {policy!r}")
    if policy == "ignore":
        return {}
    checks: dict[tuple, Check] = {}
    for path in paths:
        check = leaf_check(subspace(action_space, path), path, policy)
        if check is not None:
            checks[path] = check
    return checks


def make_fast_copies(action_space: spaces.Space, paths: list[tuple], policy: str) -> dict[tuple, tuple[int, int, int]]:
    """Per leaf path, the arguments ``(check, start, size)`` of ``shmvec._rows.copy_actions``.

    ``copy_actions`` copies a batch that needs no conversion and checks it in one C loop (the
    same check as :func:`make_action_checks`'s); a leaf missing here, or a batch it turns down,
    takes the Python path (``ShmVecEnv._write_leaf``), which also names the faulty envs.
    """
    fast: dict[tuple, tuple[int, int, int]] = {}
    for path in paths:
        space = subspace(action_space, path)
        if policy == "ignore":
            fast[path] = (ACTIONS_COPY, 0, 0)
        elif isinstance(space, spaces.Box):
            fast[path] = (ACTIONS_NO_NAN, 0, 0) if np.dtype(space.dtype).kind == "f" else (ACTIONS_COPY, 0, 0)
        elif isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
            low, size, _ = _int_range(space)
            if isinstance(low, int) and isinstance(size, int):  # one range for every element
                fast[path] = (ACTIONS_RANGE, low, size)
    return fast


def exact_integers(arr: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``arr`` (floats, integers or bools) as ``dtype`` (integers, or bool) if every value is a
    whole number that fits (for bool: 0 or 1), else None.

    SB3's PPO sends MultiBinary actions as float32 0.0/1.0 (Bernoulli samples), and numpy's
    default int64 reaches uint8 or uint16 spaces (a MultiDiscrete of dtype uint8, a list of
    Python ints): they cast exactly, as DummyVecEnv would hand them over.  Only called when the
    dtypes differ and the cast is unsafe or narrows integers, never on the usual path.
    """
    if arr.dtype.kind not in "fiub" or dtype.kind not in "iub":
        return None
    if dtype.kind == "b":  # a bool space: 0 and 1 (or 0.0 and 1.0) only
        with np.errstate(invalid="ignore"):
            return arr.astype(dtype) if ((arr == 0) | (arr == 1)).all() else None
    if arr.size:
        info = np.iinfo(dtype)
        if arr.dtype.kind == "f":
            # Bounds compared exactly, as Python floats: in float32, 2**31 would equal int32's max.
            lo, hi = float(info.min), float(info.max) + 1.0  # hi: a power of two, exact
            with np.errstate(invalid="ignore"):
                if not (np.isfinite(arr).all() and (arr == np.rint(arr)).all()
                        and float(arr.min()) >= lo and float(arr.max()) < hi):
                    return None
        elif arr.dtype.kind != "b" and not (int(arr.min()) >= info.min and int(arr.max()) <= info.max):
            return None
    return arr.astype(dtype)


def _report(policy: str, message: str, bad: list[int]) -> None:
    if policy == "raise":
        raise InvalidActionError(
            message + " Nothing was sent to the envs. Pass invalid_actions='warn' (or 'ignore') to the vec env "
            "to let such actions through.", bad)
    warnings.warn(message + " They were sent to the envs as they are (invalid_actions='warn').",
                  InvalidActionWarning, stacklevel=5)


def _bad_envs(mask: np.ndarray) -> list[int]:
    return np.flatnonzero(mask.reshape(mask.shape[0], -1).any(axis=1)).tolist()


def _where(path: tuple) -> str:
    return "".join(f"[{k!r}]" for k in path)


def _int_range(space: spaces.Space) -> tuple[Any, Any, str]:
    """``(low, size, expected)`` of an integer space: valid actions are ``low <= a < low + size``.

    ``low`` and ``size`` are ints when one value holds for every element, else int64 arrays
    (a MultiDiscrete with different starts or nvec); ``expected`` says it in words.
    """
    if isinstance(space, spaces.Discrete):
        low: Any = int(space.start)
        size: Any = int(space.n)
        return low, size, f"integers in [{low}, {low + size})"
    if isinstance(space, spaces.MultiDiscrete):
        low = np.asarray(space.start, dtype=np.int64)
        size = np.asarray(space.nvec, dtype=np.int64)
        if low.size and (low == low.flat[0]).all():
            low = int(low.flat[0])
        if size.size and (size == size.flat[0]).all():
            size = int(size.flat[0])
        return low, size, (f"integers in [start, start + nvec) = [{space.start.tolist()}, "
                           f"{(space.start + space.nvec).tolist()})")
    return 0, 2, "0 or 1"


def leaf_check(space: spaces.Space, path: tuple, policy: str) -> Check | None:
    where = _where(path)
    if isinstance(space, spaces.Box):
        if np.dtype(space.dtype).kind != "f":
            return None

        def check_nan(arr: np.ndarray) -> None:
            if arr.dtype.kind not in "fc" or not np.isnan(arr).any():
                return
            bad = _bad_envs(np.isnan(arr))
            _report(policy, f"actions{where} of envs {bad} contain NaN (action space {space}); a NaN action "
                            "usually means that the policy diverged.", bad)

        return check_nan

    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        low, size, expected = _int_range(space)
        scalar = isinstance(low, int) and isinstance(size, int)

        def check_range(arr: np.ndarray) -> None:
            # One reduction: shifted to start at 0 and seen as unsigned, any value below the
            # start becomes huge, so "max < size" covers both bounds.
            if arr.dtype.kind == "b":
                return
            shifted = arr if isinstance(low, int) and low == 0 else arr - low
            if shifted.dtype.kind == "i":
                shifted = shifted.view(_UNSIGNED[shifted.dtype.itemsize])
            if scalar:
                if shifted.size == 0 or shifted.max() < size:
                    return
                mask = shifted >= size
            else:
                mask = shifted >= size
                if not mask.any():
                    return
            bad = _bad_envs(mask)
            values = np.asarray(arr).reshape(arr.shape[0], -1)[bad].tolist()
            _report(policy, f"actions{where} of envs {bad} are out of range for {space}: got {values}, "
                            f"expected {expected}.", bad)

        return check_range
    return None


def rows_reshaped(arr: np.ndarray, n_rows: int, row_shape: tuple) -> np.ndarray | None:
    """``arr`` as ``(n_rows, *row_shape)`` when that keeps each env's row intact: the leading
    dimension is ``n_rows`` and each row has the row's shape but for dimensions of size 1
    (``(n, 1)`` for ``(n,)``, and the like), or one env's unbatched action when ``n_rows`` is 1.
    None otherwise: a reshape of ``(act_dim, n_envs)`` (transposed), or of rows of ``(3, 2)`` for
    ``(2, 3)``, would hand each env a mix of values without a word."""
    shape = (n_rows, *row_shape)
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        return None
    if n_rows == 1 and arr.shape == tuple(row_shape):
        return arr.reshape(shape)
    if arr.ndim >= 1 and arr.shape[0] == n_rows and _squeezed(arr.shape[1:]) == _squeezed(row_shape):
        return arr.reshape(shape)
    return None


def _squeezed(shape: tuple) -> tuple:
    return tuple(d for d in shape if d != 1)


def _shape_of(value: Any) -> tuple | None:
    try:
        return np.shape(value)
    except ValueError:  # a ragged nest of sequences
        return None


def _could_be_batch(space: spaces.Space, value: Any, n_rows: int) -> bool:
    """Whether ``value`` could be the batch of ``n_rows`` values of ``space`` (one level deep)."""
    kids = children(space)
    if kids is not None:  # a container's batch: a mapping (keyed) or a sequence of its children's
        if is_keyed(space):
            return isinstance(value, Mapping)
        return isinstance(value, (tuple, list)) and len(value) == len(kids)
    shape = _shape_of(value)
    return shape is not None and shape[:1] == (n_rows,) and _squeezed(shape[1:]) == _squeezed(space.shape or ())


def is_per_env(space: spaces.Space, actions: Any, n_rows: int) -> bool:
    """Whether ``actions`` for a ``Dict`` or ``Tuple`` action space is a sequence of per-env actions
    (``[{"a": ..., "b": ...}, ...]``, a list of tuples: what ``DummyVecEnv`` takes) rather than
    the batched form, nested like the space (a dict of batches, a tuple of batches).

    A Dict's batched form is a mapping, so any sequence is per-env.  A Tuple's is a sequence of
    one batch per subspace, so a sequence of another length is per-env.  When the Tuple has as
    many subspaces as there are rows, and the first item could be one env's action and also the
    batch of the first subspace (a pair of Discrete actions for two envs), a list is read as
    per-env actions and a tuple as the batched form (Gymnasium's batched Tuple value is a tuple).
    """
    kids = children(space)
    if kids is None:
        return False
    if is_keyed(space):
        return not isinstance(actions, Mapping) and hasattr(actions, "__len__")
    if isinstance(actions, Mapping) or not hasattr(actions, "__len__"):
        return False
    n_subspaces = len(kids)
    if len(actions) != n_subspaces:
        return True
    if len(actions) != n_rows or n_rows == 0:
        return False
    first = actions[0]
    one_action = isinstance(first, (tuple, list)) and len(first) == n_subspaces
    return one_action and (type(actions) is list or not _could_be_batch(kids[0][1], first, n_rows))


def _count_error(space: spaces.Space, n_actions: int, n_rows: int, rows: str) -> ValueError:
    batched = batched_form(space)
    return ValueError(
        f"got {n_actions} per-env actions for {n_rows} {rows}: pass one action per {rows[:-1]}, in a list of "
        f"{n_rows}, or the batched form ({batched})"
    )


class ActionWriter:
    """Writes a batch of actions into the shared action buffers, checking it once on the way.

    ``leaves`` are the action space's leaves with a buffer (:class:`shmvec._layout.Layout`'s
    ``act_leaves``), ``buffers`` the shared arrays by leaf path.  The usual batch (an ndarray of
    the right shape and dtype whose values pass the check) is checked and copied in one C call;
    anything else is reshaped (one row per env), cast where that is exact, checked (NaN, out of
    range: ``policy``), copied.  A ``Dict`` or ``Tuple`` action space takes the batched form
    (nested like the space) or a sequence of per-env actions (:func:`is_per_env`), stacked leaf
    by leaf.

    ``pickled``: for an action space with leaves without a fixed size, ``(messages, links)``:
    ``messages(actions)`` gives each worker's pickle of their values
    (``shmvec._pickled_leaves.PickledLeaves.action_messages``), which each worker's link puts into
    its mailbox and ARG_LEN word, or leaves for its pipe when larger (``shmvec._link.Link.put_arg``;
    :meth:`write` returns those).
    """

    def __init__(self, action_space: spaces.Space, leaves: list, buffers: Any, n_envs: int, policy: str,
                 pickled: tuple[Callable[[Any], list[bytes]], Any] | None = None) -> None:
        self.space = action_space
        self.leaves = list(leaves)
        self.buffers = buffers
        self.n_envs = n_envs
        self.pickled = pickled
        paths = [leaf.path for leaf in self.leaves]
        self.root = len(self.leaves) == 1 and paths[0] == ()  # the space is one leaf (a Box, Discrete, ...)
        # The usual batched form's type: a dict for a Dict space, a tuple for a Tuple space.
        kids = children(action_space)
        keyed = kids is not None and is_keyed(action_space)
        self.batch_type = dict if keyed else tuple
        self.n_subspaces = len(kids) if kids is not None and not keyed else 0
        self.checks = make_action_checks(action_space, paths, policy)
        self.fast = make_fast_copies(action_space, paths, policy)
        # One action leaf whose batch copy_actions checks and copies in one C call: (buffer, *args).
        fast = self.fast.get(()) if len(self.leaves) == 1 and pickled is None else None
        self.single = (buffers[()], *fast) if fast is not None else None

    def release(self) -> None:
        """Drops the views of the buffers (before they are unmapped): a traceback that keeps a frame
        of :meth:`write` keeps this object, which must not keep the mapping."""
        self.buffers = self.single = self.pickled = None

    def write(self, actions: Any, checked: bool = False) -> dict[int, bytes] | None:
        """``checked``: ``actions`` is the batch of a one-leaf space, of its shape and dtype, that
        the caller has checked with this module's rules already (ShmParallelEnv, agent by agent,
        to name them): copied as it is (a second check would warn twice with ``invalid_actions="warn"``).

        :returns: with leaves without a fixed size, the pickles of their values to send through
            the workers' pipes once the step is posted, by worker (the others are in the mailboxes).
        :raises ValueError: the actions do not fit the space (shape, dtype, the number of per-env
            actions; a leaf without a fixed size: not one value per env); ``InvalidActionError`` (a
            ValueError): NaN or out of range, naming the envs (``invalid_actions="raise"``); what
            pickling a value raised."""
        if checked and self.root and self.pickled is None:
            np.copyto(self.buffers[()], actions, casting="safe")
            return None
        messages = self.pickled[0](actions) if self.pickled is not None else None  # raises before any write
        if self.root:
            self._write_leaf(self.leaves[0], actions)
        elif not self._usual_batch(actions, self.n_envs) and is_per_env(self.space, actions, self.n_envs):
            for leaf, column in zip(self.leaves, self._columns(actions, self.n_envs, "envs")):
                self._write_leaf(leaf, column)
        else:
            for leaf in self.leaves:
                value = actions
                try:
                    for key in leaf.path:
                        value = value[key]
                except (KeyError, IndexError, TypeError):
                    raise self._no_batch(actions, leaf.path, self.n_envs) from None
                self._write_leaf(leaf, value)
        return self._put_messages(messages) if messages is not None else None

    def _put_messages(self, messages: list[bytes]) -> dict[int, bytes]:
        links = self.pickled[1]
        in_pipe: dict[int, bytes] = {}
        for w, data in enumerate(messages):
            if links[w].put_arg(data) is not None:  # larger than the mailbox: the pipe, once posted
                in_pipe[w] = data
        return in_pipe

    def write_rows(self, actions: Any, rows: np.ndarray, what: str = "env ids",
                   relabel: Callable[[InvalidActionError, np.ndarray], InvalidActionError] | None = None) -> None:
        """Writes row k of ``actions`` as env ``rows[k]``'s action (a pool's ``send``): the batched
        form, or one action per row (a list of dicts for a Dict space), each leaf cast exactly
        (:func:`leaf_batch`) and checked before it is written.

        :raises ValueError: as :meth:`write` (``what`` names the rows); ``InvalidActionError`` names
            the rows of ``actions`` that failed, or is what ``relabel(error, rows)`` makes of it."""
        # No local name for a view of the block: the traceback of an error raised here (kept by
        # the caller) would keep the mapping open after close().
        n = rows.size
        for leaf, value in zip(self.leaves, self.leaf_values(actions, n, what)):
            arr = leaf_batch(value, leaf, n, what)  # one row per id, cast exactly
            check = self.checks.get(leaf.path)
            fast = self.fast.get(leaf.path)
            if check is not None and (fast is None or not copy_actions(arr, np.empty_like(arr), *fast)):
                # Out of range, NaN (invalid_actions=), before anything is sent; the usual batch
                # passed copy_actions' check in one C pass (docs/design.md).
                try:
                    check(arr)
                except InvalidActionError as exc:
                    if relabel is None:
                        raise
                    raise relabel(exc, rows) from None
            self.buffers[leaf.path][rows] = arr.astype(leaf.dtype, copy=False)

    def leaf_values(self, actions: Any, n_rows: int, rows: str = "envs") -> list:
        """Each leaf's batch in ``actions``, in the order of :attr:`leaves`: taken from the batched
        form, or gathered from ``n_rows`` per-env actions (a list per leaf, stacked by the caller).

        :raises ValueError: per-env actions that are not ``n_rows``, or lack a key or item of the
            space; ``rows`` names what the rows are ("envs", "env ids").
        """
        if self.root:
            return [actions]
        if not self._usual_batch(actions, n_rows) and is_per_env(self.space, actions, n_rows):
            return self._columns(actions, n_rows, rows)
        out = []
        for leaf in self.leaves:
            value = actions
            try:
                for key in leaf.path:
                    value = value[key]
            except (KeyError, IndexError, TypeError):
                raise self._no_batch(actions, leaf.path, n_rows) from None
            out.append(value)
        return out

    def _usual_batch(self, actions: Any, n_rows: int) -> bool:
        """The usual batched form, known at once: a dict for a Dict space, a tuple of one batch
        per subspace for a Tuple space (of another length than ``n_rows``)."""
        kind = type(actions)
        return kind is self.batch_type and (kind is dict or len(actions) == self.n_subspaces != n_rows)

    def _columns(self, actions: Any, n_rows: int, rows: str) -> list[list]:
        """Per leaf, the list of each env's value in the per-env ``actions``."""
        if len(actions) != n_rows:
            raise _count_error(self.space, len(actions), n_rows, rows)
        columns = []
        for leaf in self.leaves:
            column = []
            for k, action in enumerate(actions):
                value = action
                try:
                    for key in leaf.path:
                        value = value[key]
                except (KeyError, IndexError, TypeError):
                    raise ValueError(
                        f"actions[{k}] has no value at {_where(leaf.path)} ({type(action).__name__} {action!r}): "
                        f"each per-env action is one action of the space {self.space}"
                    ) from None
                column.append(value)
            columns.append(column)
        return columns

    def _no_batch(self, actions: Any, path: tuple, n_rows: int) -> ValueError:
        return ValueError(
            f"actions ({type(actions).__name__}) have no batch at {_where(path)}: for the action space {self.space}, "
            f"pass the batched form, nested like the space, or a list of {n_rows} per-env actions"
        )

    def _write_leaf(self, leaf: Any, value: Any) -> None:
        # No local name for a view of the buffers: the traceback of an exception raised here
        # would keep the mapping (and its fd) alive after close().
        fast = self.fast.get(leaf.path)
        if fast is not None and copy_actions(value, self.buffers[leaf.path], *fast):
            return  # an ndarray of the right shape and dtype whose values pass the check
        arr = leaf_batch(value, leaf, self.n_envs)
        check = self.checks.get(leaf.path)
        if check is not None:
            check(arr)  # NaN, out of range: raises InvalidActionError (or warns) naming the envs
        np.copyto(self.buffers[leaf.path], arr, casting="unsafe")


def leaf_batch(value: Any, leaf: Any, n_rows: int, rows: str = "envs") -> np.ndarray:
    """``value``, one leaf's batch, as an array of ``(n_rows, *leaf.shape)`` (:func:`batch_array`)
    whose values the leaf's dtype holds as they are: cast where that is exact (whole floats and
    integers that fit, as SB3 sends MultiBinary actions), never truncated, wrapped or broadcast.
    Every face's actions go through it (ActionWriter, ShmParallelEnv's per-agent batches); the
    values are checked after it (:func:`leaf_check`).

    :raises ValueError: not one row per env (:func:`batch_array`), or a dtype that does not cast
        exactly (``1.7`` for an integer space).
    """
    return exact_cast(batch_array(value, leaf, n_rows, rows), leaf.dtype, leaf.path)


def exact_cast(arr: np.ndarray, dtype: np.dtype, path: tuple = ()) -> np.ndarray:
    """``arr``, a batch of the actions at ``path``, ready for a buffer of ``dtype``: itself when
    numpy casts it without loss (the same kind, or wider), else its values as ``dtype`` when each
    is exact there (:func:`exact_integers`: whole floats, integers that fit).  The cast rule of
    every face: a value is never truncated or wrapped.

    :raises ValueError: a value that ``dtype`` does not hold as it is (``1.7`` for an integer space).
    """
    if arr.dtype == dtype or (dtype.kind not in "iu" and np.can_cast(arr.dtype, dtype, "same_kind")):
        return arr
    exact = exact_integers(arr, dtype)
    if exact is None:
        raise ValueError(
            f"actions{_where(path)} have dtype {arr.dtype}, which does not cast safely to {dtype} "
            "(floats or other integers are accepted for an integer space only when every value is a whole "
            f"number that fits); got {_shown(arr)}")
    return exact


def _shown(arr: np.ndarray, most: int = 8) -> str:
    """The first ``most`` values of ``arr``, flat, for a message."""
    values = str(arr.reshape(-1)[:most].tolist())
    return values if arr.size <= most else values[:-1] + ", ...]"


def batch_array(value: Any, leaf: Any, n_rows: int, rows: str = "envs") -> np.ndarray:
    """``value``, one leaf's batch (an array, or a list of per-env values), as an array of shape
    ``(n_rows, *leaf.shape)``.

    :raises ValueError: it does not have one row per env (naming the count of a list), or its
        per-env values do not stack (naming the first one of another shape).
    """
    try:
        arr = np.asarray(value)
    except ValueError:  # per-env values of different shapes
        raise stack_error(value, leaf, n_rows) from None
    return arr if arr.shape == (n_rows, *leaf.shape) else as_rows(arr, value, leaf, n_rows, rows)


def stack_error(value: Any, leaf: Any, n_rows: int) -> ValueError:
    """The error for per-env values of one leaf that numpy cannot stack, naming the first of another shape."""
    where = _where(leaf.path)
    bad = next((k for k, v in enumerate(value) if _shape_of(v) != tuple(leaf.shape)), None)
    got = "" if bad is None else f": actions[{bad}]{where} has shape {_shape_of(value[bad])}"
    return ValueError(f"the per-env actions{where} do not stack into a batch of shape {(n_rows, *leaf.shape)}{got}, "
                      f"the action space's is {tuple(leaf.shape)}")


def as_rows(arr: np.ndarray, value: Any, leaf: Any, n_rows: int, rows: str = "envs") -> np.ndarray:
    """``arr`` (``value`` as an array) reshaped to one row per env (:func:`rows_reshaped`), or the
    error that names the shapes, and the count of a list of per-env actions."""
    reshaped = rows_reshaped(arr, n_rows, leaf.shape)
    if reshaped is not None:
        return reshaped
    count = ""
    if isinstance(value, (list, tuple)) and len(value) != n_rows:
        count = f"; got a list of {len(value)} per-env actions for {n_rows} {rows}"
    raise ValueError(
        f"actions{_where(leaf.path)} have shape {arr.shape}; expected {(n_rows, *leaf.shape)} "
        f"({n_rows} {rows} x the action space's {leaf.shape}; one row per {rows[:-1]}, first{count})"
    )
