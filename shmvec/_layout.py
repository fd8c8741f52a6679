"""Where every buffer lives in the shared-memory block, computed from the spaces.

Both the parent and the workers build a :class:`Layout` from the same
arguments, so only the segment's name and these arguments cross the pipe.
A space is split into leaves (``Box``, ``Discrete``, ``MultiDiscrete``,
``MultiBinary``), one buffer per leaf; ``Dict`` and ``Tuple`` nest.  A leaf without a fixed size
(``Text``, ``Sequence``, ``Graph``, ``OneOf``, any other ``Space``) has no buffer: its values
travel pickled in the workers' messages (:mod:`shmvec._pickled_leaves`), and the gathers and
scatters below take a Python list with one slot per env in its place.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass
from functools import singledispatch
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import is_space_dtype_shape_equiv

from shmvec import _protocol as P
from shmvec._actions import exact_integers
from shmvec._containers import assembler, children, is_keyed
from shmvec._errors import ObservationError, SpaceError
from shmvec._rows import RowWriter

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

ALIGN = 64

Path = tuple  # keys from the root of a space to a leaf: () for a flat space


@dataclass(frozen=True)
class Leaf:
    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    pickled: bool = False  # no fixed size: its values travel pickled, not in a buffer


@singledispatch
def space_leaves(space: spaces.Space, path: Path = ()) -> list[Leaf]:
    """The leaves of ``space``: a ``Space`` without a fixed size (``Text``, ``Sequence``,
    ``Graph``, ``OneOf``, a custom subclass) is one pickled leaf.

    :raises SpaceError: something that is not a ``gymnasium.spaces.Space``.
    """
    kids = children(space)  # a container (shmvec._containers): the leaves of its children, in order
    if kids is not None:
        return [leaf for key, sub in kids for leaf in space_leaves(sub, path + (key,))]
    if isinstance(space, spaces.Space):
        return [Leaf(path, (), np.dtype(object), pickled=True)]
    where = "the space" if not path else f"the subspace at {list(path)}"
    raise SpaceError(
        f"{where} is {type(space).__name__}, not a gymnasium.spaces.Space: shmvec runs Gymnasium envs (wrap an "
        "old Gym env with shimmy's compatibility wrappers inside the factory)."
    )


@space_leaves.register
def _(space: spaces.Box, path: Path = ()) -> list[Leaf]:
    return [Leaf(path, tuple(space.shape), np.dtype(space.dtype))]


@space_leaves.register
def _(space: spaces.Discrete, path: Path = ()) -> list[Leaf]:
    return [Leaf(path, (), np.dtype(space.dtype))]


@space_leaves.register
def _(space: spaces.MultiDiscrete, path: Path = ()) -> list[Leaf]:
    return [Leaf(path, tuple(space.shape), np.dtype(space.dtype))]


@space_leaves.register
def _(space: spaces.MultiBinary, path: Path = ()) -> list[Leaf]:
    return [Leaf(path, tuple(space.shape), np.dtype(space.dtype))]




def check_same_spaces(i: int, mine: tuple, first_i: int, first: tuple) -> None:
    """:raises SpaceError: env ``i``'s ``(observation_space, action_space)`` differ from env ``first_i``'s;
    when they print the same, it says why (a ``Space`` subclass without ``__eq__``)."""
    for name, a, b in zip(("observation_space", "action_space"), mine, first):
        if a != b:
            raise SpaceError(
                f"env {i} has {name} {a}, env {first_i} has {b}: all envs of a vec env must share their spaces."
                + ("" if repr(a) != repr(b) else " (They print the same: a Space subclass without __eq__ compares by "
                   "identity, so that no two instances are equal; define __eq__ on it, as Gymnasium's spaces do.)"))


def same_shapes(a: spaces.Space, b: spaces.Space) -> bool:
    """Whether ``a`` and ``b`` have the same structure and, leaf by leaf, the same shape and dtype
    (Gymnasium's ``is_space_dtype_shape_equiv``): they may differ only in bounds (``Box`` low and
    high, ``Discrete`` n, ...), and one layout holds the values of both.  False for spaces
    Gymnasium cannot compare so (a custom ``Space``)."""
    try:
        return bool(is_space_dtype_shape_equiv(a, b))
    except NotImplementedError:
        return False


def _path_key(leaf: Leaf) -> tuple:
    """A leaf's place in the block: the same in every process for the same set of paths
    (Dict keys need not be sortable among themselves: int and str keys can mix)."""
    return tuple((type(k).__name__, repr(k)) for k in leaf.path)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def split_envs(n_envs: int, n_workers: int) -> list[range]:
    """Contiguous slices of env indices, sizes differing by at most one."""
    base, extra = divmod(n_envs, n_workers)
    out, start = [], 0
    for w in range(n_workers):
        stop = start + base + (1 if w < extra else 0)
        out.append(range(start, stop))
        start = stop
    return out


def group_by_slice(targets: list[int], slices: list[range]) -> dict[int, tuple[list[int], list[int]]]:
    """Env indices grouped by the slice (worker or actor) that holds them: ``{k: (indices, positions)}``.

    Answers go back by position, not by env index: as in DummyVecEnv, an index given twice runs
    twice, and a negative one counts from the end.  ``positions`` are where each index stood in
    ``targets``.

    :raises IndexError: an index outside ``[-n_envs, n_envs)``.
    :raises TypeError: an index that is not an integer (checked for all before any env is called,
        as DummyVecEnv raises before it changes anything).
    """
    n_envs = slices[-1].stop
    stops = [sl.stop for sl in slices]
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for pos, i in enumerate(targets):
        try:
            i = operator.index(i)  # numpy integers too; 1.0 and "1" are refused
        except TypeError:
            raise TypeError(f"env indices must be integers, got {i!r} ({type(i).__name__})") from None
        if not -n_envs <= i < n_envs:
            raise IndexError(f"env index {i} out of range for {n_envs} envs")
        i %= n_envs
        k = bisect.bisect_right(stops, i)
        indices, positions = groups.setdefault(k, ([], []))
        indices.append(i)
        positions.append(pos)
    return groups


class Layout:
    """Offsets of every buffer; :meth:`views` turns a buffer into numpy arrays."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, n_envs: int,
                 n_workers: int, mailbox_bytes: int = P.MAILBOX_BYTES, mask_size: int = 0,
                 obs_blocks: int = 0) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.n_envs = n_envs
        self.n_workers = n_workers
        self.mailbox_bytes = mailbox_bytes
        obs_all, act_all = space_leaves(observation_space), space_leaves(action_space)
        # Leaves with a buffer; the paths of those without one (pickled), in the buffers' order.
        self.obs_leaves = [leaf for leaf in obs_all if not leaf.pickled]
        self.act_leaves = [leaf for leaf in act_all if not leaf.pickled]
        self.obs_pickled = [leaf.path for leaf in sorted(obs_all, key=_path_key) if leaf.pickled]
        self.act_pickled = [leaf.path for leaf in sorted(act_all, key=_path_key) if leaf.pickled]
        self._entries: list[tuple[str, Any, int, tuple[int, ...], np.dtype]] = []
        offset = 0

        def add(kind: str, key: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
            nonlocal offset
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self._entries.append((kind, key, offset, shape, dtype))
            offset = _align(offset + nbytes)

        # Buffers in an order of the leaves' paths, not of the space's keys: two envs whose Dict
        # spaces list the same keys in another order have equal spaces (Gymnasium's Dict.__eq__),
        # and each process builds this layout from its own env's space.
        obs_leaves, act_leaves = sorted(self.obs_leaves, key=_path_key), sorted(self.act_leaves, key=_path_key)
        add("ctrl", None, ((n_workers + 1) * P.ROW_WORDS,), np.dtype(np.uint32))
        for leaf in act_leaves:
            add("act", leaf.path, (n_envs, *leaf.shape), leaf.dtype)
        for leaf in obs_leaves:
            add("obs", leaf.path, (n_envs, *leaf.shape), leaf.dtype)
        for leaf in obs_leaves:
            add("term_obs", leaf.path, (n_envs, *leaf.shape), leaf.dtype)
        add("rew", None, (n_envs,), np.dtype(np.float64))
        add("terminated", None, (n_envs,), np.dtype(np.bool_))
        add("truncated", None, (n_envs,), np.dtype(np.bool_))
        add("mailbox", None, (n_workers, mailbox_bytes), np.dtype(np.uint8))
        self.mask_size = mask_size
        if mask_size:  # action masks (shmvec._masks), only when they are on
            add("mask", None, (n_envs, mask_size), np.dtype(np.bool_))
        # Lease blocks (zero_copy, shmvec._leases): more sets of observation buffers, last, so that
        # the pages of those never used need not be reserved.
        self.obs_blocks = obs_blocks
        self.lease_spans: list[tuple[int, int]] = []  # (offset, nbytes) of each lease block
        for b in range(1, obs_blocks + 1):
            start = offset
            for leaf in obs_leaves:
                add("lease", (b, leaf.path), (n_envs, *leaf.shape), leaf.dtype)
            self.lease_spans.append((start, offset - start))
        self.ctrl_offset = self._entries[0][2]
        self.ctrl_words = (n_workers + 1) * P.ROW_WORDS
        self.nbytes = max(offset, ALIGN)
        self.base_nbytes = max(self.lease_spans[0][0] if obs_blocks else offset, ALIGN)  # without the lease blocks

    def views(self, buf: memoryview) -> "Views":
        arrays: dict[tuple[str, Any], np.ndarray] = {}
        for kind, key, offset, shape, dtype in self._entries:
            count = int(np.prod(shape, dtype=np.int64))
            arrays[(kind, key)] = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
        return Views(self, arrays)


class Views:
    """Numpy arrays over one mapping of the block.  Drop every reference before closing the mapping.

    In ``obs``, ``term_obs`` and ``act`` a leaf without a fixed size has, in place of a buffer, a
    list of this process's values of it (one slot per env), filled from the messages that carry
    them (shmvec._pickled_leaves).
    """

    def __init__(self, layout: Layout, arrays: dict[tuple[str, Any], np.ndarray]) -> None:
        n = layout.n_envs
        self.obs: dict[Path, Any] = {leaf.path: arrays[("obs", leaf.path)] for leaf in layout.obs_leaves}
        self.term_obs: dict[Path, Any] = {leaf.path: arrays[("term_obs", leaf.path)] for leaf in layout.obs_leaves}
        self.act: dict[Path, Any] = {leaf.path: arrays[("act", leaf.path)] for leaf in layout.act_leaves}
        # Block 0 (obs) and the lease blocks, if any (zero_copy: shmvec._leases).
        self.obs_blocks: list[dict[Path, Any]] = [self.obs] + [
            {leaf.path: arrays[("lease", (b, leaf.path))] for leaf in layout.obs_leaves}
            for b in range(1, layout.obs_blocks + 1)]
        for path in layout.obs_pickled:
            self.obs[path], self.term_obs[path] = [None] * n, [None] * n
        for path in layout.act_pickled:
            self.act[path] = [None] * n
        self.rew = arrays[("rew", None)]
        self.terminated = arrays[("terminated", None)]
        self.truncated = arrays[("truncated", None)]
        self.mailbox = arrays[("mailbox", None)]
        self.mask: np.ndarray | None = arrays.get(("mask", None))


# ---------------------------------------------------------------------------------------------
# Structured values <-> leaf buffers.  Built once per space; the returned closures run per env.
# ---------------------------------------------------------------------------------------------

def scalar_float_box(space: spaces.Space) -> bool:
    """A ``Box`` of shape ``()`` and a float dtype: one env's value is a 0-d array (see _gather)."""
    return isinstance(space, spaces.Box) and space.shape == () and np.issubdtype(space.dtype, np.floating)


def make_gather(space: spaces.Space, leaves: dict[Path, Any], copy: bool,
                top_dict: type = dict, batch: Callable[[list], Any] = tuple) -> Callable[[Any], Any]:
    """Returns ``f(index)`` that assembles a structured value from the leaf buffers.

    ``index`` is an int (one env) or a slice (a batch).  With ``copy`` the
    result owns its memory; without, it is a view of the buffers.  ``top_dict``: the type of a
    top-level ``Dict``'s value (SB3's vec envs return an ``OrderedDict`` batch).  A pickled leaf
    (a list in ``leaves``, one value per env) gives env i's value for an int, and ``batch`` of the
    values for a slice or an array of indices (Gymnasium: a tuple; SB3: see shmvec._pickled_leaves).
    """
    f = _gather(space, (), leaves, copy, batch)
    if top_dict is not dict and children(space) is not None and is_keyed(space):
        return lambda i: top_dict(f(i))
    return f


def _gather(space: spaces.Space, path: Path, leaves: dict[Path, Any], copy: bool,
            batch: Callable[[list], Any] = tuple) -> Callable[[Any], Any]:
    # Module-level recursion: a nested function that calls itself would form a reference
    # cycle holding the buffers until the garbage collector runs, and the mapping could
    # not be closed.
    arr = leaves.get(path)
    if type(arr) is list:  # a pickled leaf (Text, Sequence, ...): one value per env
        return _gather_values(arr, batch)
    kids = children(space)
    if kids is not None:
        items = [_gather(s, path + (key,), leaves, copy, batch) for key, s in kids]
        build = assembler(space)
        return lambda i: build([f(i) for f in items])
    arr = leaves[path]
    if arr.ndim == 1 and scalar_float_box(space):
        # One env's value of a scalar float Box as a 0-d array, as Box.sample() gives it (and
        # envs built on it): arr[i] would be a numpy scalar.  A scalar integer or bool Box, a
        # Discrete and a MultiDiscrete of shape () stay numpy scalars, as their sample() gives them.
        if copy:
            return lambda i: arr[i, ...].copy()
        return lambda i: arr[i, ...]
    if copy:
        return lambda i: arr[i].copy()
    return arr.__getitem__


def _gather_values(values: list, batch: Callable[[list], Any]) -> Callable[[Any], Any]:
    """A pickled leaf's gather: env i's value itself (each arrives unpickled, an object of its own,
    so a copy would add nothing), or ``batch`` of the values of a slice or of an index array."""
    def gather(i: Any) -> Any:
        if isinstance(i, slice):
            return batch(values[i])
        if isinstance(i, np.ndarray):
            return batch([values[k] for k in i.tolist()])
        return values[i]

    return gather


def make_scatter(space: spaces.Space, leaves: dict[Path, Any], what: str,
                 at: tuple[Any, int] | None = None) -> Callable[[int, Any], None]:
    """Returns ``f(index, value)`` that writes one env's structured value into the leaf buffers.

    Checks the shape of every leaf (numpy would otherwise broadcast silently)
    and that its dtype casts to the buffer's within the same kind; raises
    ObservationError naming the field.  A pickled leaf (a list in ``leaves``) takes the value
    into slot ``index`` as it is.  ``at``: ``(words, index)`` of a word that each write
    of row ``i`` sets to ``i + 1`` (a worker's ENV_AT, see ``shmvec._rows.RowWriter``).
    """
    return _scatter(space, (), leaves, what, at)


def _scatter(space: spaces.Space, path: Path, leaves: dict[Path, Any], what: str,
             at: tuple[Any, int] | None = None) -> Callable[[int, Any], None]:
    values = leaves.get(path)
    if type(values) is list:  # a pickled leaf: kept as it is, sent in the worker's message
        return _scatter_values(values, at)
    keyed = children(space)
    if keyed is not None:
        parts = [(key, _scatter(s, path + (key,), leaves, what, at)) for key, s in keyed]

        def scatter_nested(i: int, value: Any) -> None:
            for key, f in parts:
                try:
                    item = value[key]
                except (KeyError, IndexError, TypeError):
                    raise ObservationError(f"{what}{_fmt(path)} has no entry {key!r}") from None
                f(i, item)

        return scatter_nested

    arr = leaves[path]
    shape = arr.shape[1:]
    dtype = arr.dtype
    field = f"{what}{_fmt(path)}"

    def scatter_leaf(i: int, value: Any) -> None:
        if type(value) is not np.ndarray:  # a list, a number: checked as the same values in an array
            value = np.asarray(value)
        if value.shape != shape:
            raise ObservationError(f"{field} has shape {value.shape}, the space declares {shape}")
        if value.dtype != dtype and (dtype.kind in "iu" or not np.can_cast(value.dtype, dtype, "same_kind")):
            # int64 pixels for a uint8 Box (DummyVecEnv casts them, wrapping 300 to 44): taken
            # when every value fits (checked for every cast into an integer buffer)
            exact = exact_integers(value, dtype)
            if exact is None:
                raise ObservationError(
                    f"{field} has dtype {value.dtype}, which does not cast to the space's {dtype} (other "
                    "integers, and whole floats, are taken only when every value fits)")
            value = exact
        arr[i] = value

    if arr.flags.c_contiguous and arr.ndim >= 1:
        # The usual case (an ndarray of the row's shape and dtype) as one memcpy in C; anything
        # else falls through to scatter_leaf, which converts, checks and raises as before.
        return RowWriter(arr, scatter_leaf) if at is None else RowWriter(arr, scatter_leaf, *at)
    return scatter_leaf


def _scatter_values(values: list, at: tuple[Any, int] | None) -> Callable[[int, Any], None]:
    """A pickled leaf's scatter: env i's value into slot i (unchecked, as SubprocVecEnv and
    SyncVectorEnv take it); with ``at``, sets that word to ``i + 1`` as RowWriter does."""
    if at is None:
        return values.__setitem__
    words, index = at

    def scatter(i: int, value: Any) -> None:
        values[i] = value
        words.store(index, i + 1)

    return scatter


def _fmt(path: Path) -> str:
    return "".join(f"[{k!r}]" for k in path)


def close_mapping(shm: "SharedMemory") -> None:
    """Closes ``shm``; if arrays still view it (``copy=False`` results the caller kept), leaves the
    mapping to them: it is unmapped when the last of them is garbage-collected."""
    try:
        shm.close()
    except BufferError:
        import os

        fd = shm._fd  # type: ignore[attr-defined]
        shm._buf = None  # type: ignore[attr-defined]
        shm._mmap = None  # type: ignore[attr-defined]
        if fd >= 0:
            os.close(fd)
            shm._fd = -1  # type: ignore[attr-defined]
