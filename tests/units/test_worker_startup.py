"""The worker's start-up records (shmvec._startup_args), each built once, and the worker's own walkers.

- a worker starts from one ``WorkerStart`` and attaches from one ``Attach``: each is built by
  exactly one function of the package (``WorkerSet.worker_start``, ``WorkerSet.send_attach``);
- the block is laid out only through ``BlockSizes.layout``, by the parent and by every worker
  (the pool's worker side reads the worker's views, it lays out nothing of its own);
- every rare command has its handler in the worker, and nothing else does;
- the worker splits a batch of container actions into per-env values as it did before
  ``shmvec._containers`` (nested Dict and Tuple, an empty Dict).
"""

from __future__ import annotations

import ast
import collections
import pickle
from pathlib import Path

import numpy as np
from gymnasium import spaces

import shmvec
from shmvec import _protocol as P
from shmvec._layout import Layout
from shmvec._startup_args import Attach, BlockSizes, WorkerStart
from shmvec._worker import unbatcher
from shmvec._worker_pipe import RARE_COMMANDS

PACKAGE_DIR = Path(shmvec.__file__).parent


def _calls_of(name: str) -> list[str]:
    """``module:function`` of every call of ``name(...)`` (or ``x.name(...)``) in the package."""
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call):
                    callee = node.func
                    called = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
                    if called == name:
                        found.append(f"{path.relative_to(PACKAGE_DIR)}:{func.name}")
    return sorted(set(found))


def test_each_record_is_built_in_one_place():
    assert _calls_of("WorkerStart") == ["_workers.py:worker_start"]
    assert _calls_of("Attach") == ["_workers.py:send_attach"]


def test_the_block_is_laid_out_from_block_sizes_only():
    """Every Layout of the block comes from BlockSizes.layout: the parent's, each worker's, and no
    other for the pool (shmvec.doctor sizes a block it never maps)."""
    assert [where for where in _calls_of("Layout") if not where.startswith("doctor.py:")] == ["_startup_args.py:layout"]


def test_block_sizes_lay_out_what_layout_does():
    obs, act = spaces.Box(-1, 1, (3, 2), np.float32), spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(0, 1, (2,))})
    sizes = BlockSizes(n_envs=5, n_workers=2, mailbox_bytes=128, mask_size=3, obs_blocks=2)
    mine, theirs = sizes.layout(obs, act), Layout(obs, act, 5, 2, 128, 3, 2)
    assert (mine.nbytes, mine.base_nbytes, mine.lease_spans) == (theirs.nbytes, theirs.base_nbytes, theirs.lease_spans)
    assert mine._entries == theirs._entries


def test_the_records_pickle_as_they_are():
    """They cross the process line (spawn pickles WorkerStart; ATTACH carries Attach)."""
    start = WorkerStart(1, range(2, 4), b"fns", 123, None, 0.001, affinity=frozenset({0, 1}),
                        autoreset=P.AUTORESET_NEXT_STEP, registrations=None, public_name="ShmVectorEnv")
    attach = Attach(None, BlockSizes(4, 2, 64), masks_live=True)
    assert pickle.loads(pickle.dumps(start)) == start
    assert pickle.loads(pickle.dumps(attach)) == attach


def test_every_rare_command_has_one_handler():
    assert set(RARE_COMMANDS) == set(P.Call)


def _old_unbatch(space, batch, n):
    """The worker's splitting before shmvec._containers, kept here as the reference."""
    if isinstance(space, spaces.Dict):
        parts = {key: _old_unbatch(sub, batch[key], n) for key, sub in space.spaces.items()}
        return [{key: parts[key][j] for key in parts} for j in range(n)]
    if isinstance(space, spaces.Tuple):
        parts_t = [_old_unbatch(sub, batch[k], n) for k, sub in enumerate(space.spaces)]
        return [tuple(p[j] for p in parts_t) for j in range(n)]
    return list(batch)


def test_the_worker_splits_container_actions_as_before():
    inner = spaces.Dict(collections.OrderedDict([("z", spaces.Discrete(4)), ("a", spaces.Box(0, 1, (2,)))]))
    space = spaces.Tuple((spaces.Discrete(3), inner, spaces.Dict({})))
    n = 3
    batch = (list(range(n)), {"z": [np.int64(j) for j in range(n)], "a": [np.full(2, j) for j in range(n)]}, {})
    got, want = unbatcher(space)(batch, n), _old_unbatch(space, batch, n)
    assert len(got) == len(want) == n
    for g, w in zip(got, want):
        assert type(g) is tuple and g[0] == w[0] and g[2] == w[2] == {}
        assert list(g[1]) == list(w[1]) == ["z", "a"]
        assert g[1]["z"] == w[1]["z"] and np.array_equal(g[1]["a"], w[1]["a"])
    assert unbatcher(spaces.Dict({}))({}, 2) == [{}, {}]
    assert unbatcher(spaces.Discrete(2)) is None
