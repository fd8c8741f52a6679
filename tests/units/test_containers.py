"""shmvec._containers: the one dispatch point of container spaces, and every walker going through it."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

import shmvec
from shmvec._containers import assembler, batched_form, child_values, children, is_keyed

PACKAGE_DIR = Path(shmvec.__file__).parent


def test_children_of_each_kind():
    d = spaces.Dict(collections.OrderedDict([("b", spaces.Discrete(2)), ("a", spaces.Box(0, 1, (2,)))]))
    t = spaces.Tuple((spaces.Discrete(3), d))
    assert [k for k, _ in children(d)] == ["b", "a"]  # the space's own order
    assert [k for k, _ in children(t)] == [0, 1]
    assert children(t)[1][1] is d
    assert children(spaces.Box(0, 1, (2,))) is None
    assert children(spaces.Text(5)) is None


def test_assembler_builds_the_kinds_value():
    d = spaces.Dict(collections.OrderedDict([("b", spaces.Discrete(2)), ("a", spaces.Discrete(2))]))
    assert assembler(d)([1, 2]) == {"b": 1, "a": 2}
    od = assembler(d, collections.OrderedDict)([1, 2])
    assert type(od) is collections.OrderedDict and list(od) == ["b", "a"]
    assert assembler(spaces.Tuple((spaces.Discrete(2),) * 2))(iter([3, 4])) == (3, 4)
    with pytest.raises(TypeError, match="not a container"):
        assembler(spaces.Discrete(2))


def test_keyed_and_words():
    d = spaces.Dict({"a": spaces.Discrete(2)})
    t = spaces.Tuple((spaces.Discrete(2),) * 3)
    assert is_keyed(d) and not is_keyed(t)
    assert batched_form(d) == "a dict of batches, one per key"
    assert batched_form(t) == "a tuple of 3 batches, one per subspace"
    assert child_values(d, {"a": np.zeros(2)})[0].shape == (2,)
    assert child_values(t, (1, 2, 3)) == [1, 2, 3]


def test_a_new_container_kind_is_one_registration_each():
    """A subclass of Dict is a Dict to every walker (singledispatch follows the class's MRO)."""

    class MyDict(spaces.Dict):
        pass

    space = MyDict({"x": spaces.Discrete(2)})
    assert children(space) == [("x", space.spaces["x"])]
    assert is_keyed(space)


WALKER_MODULES = ["_layout.py", "_leases.py", "_actions.py", "_restarts.py", "vec_env_pool.py", "ray/batching.py",
                  "_worker.py"]


@pytest.mark.parametrize("name", WALKER_MODULES)
def test_walkers_ask_the_dispatch_point(name):
    """No module but shmvec._containers tests a space for ``Dict`` or ``Tuple`` to walk into it:
    ``isinstance(x, spaces.Dict)`` (or ``Tuple``, or both) appears nowhere else in these modules."""
    tree = ast.parse((PACKAGE_DIR / name).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            kinds = node.args[1]
            names = [kinds] if not isinstance(kinds, ast.Tuple) else list(kinds.elts)
            for n in names:
                attr = n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                if attr in ("Dict", "Tuple"):
                    found.append(f"{name}:{node.lineno}")
    assert not found, f"container kinds tested outside shmvec._containers: {found}"
