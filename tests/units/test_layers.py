"""The package's imports point down its layers, form no cycle, and take no private name across modules.

Every ``import`` in every module of ``shmvec`` is read from its source (imports inside functions
included, which hide cycles from Python itself), and checked against ``LAYERS``: a module may
import modules of its own layer or of lower ones, never of a higher one.  Within one layer the
imports must still form no cycle.  ``from shmvec.x import _name`` (a private name of another
module, not a submodule) and ``x._name`` on an imported shmvec module are refused.

The layers (docs/design.md, "Layers"), lowest first.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import shmvec

PACKAGE_DIR = Path(shmvec.__file__).parent

LAYERS: list[tuple[str, list[str]]] = [
    ("native", ["shmvec._sync", "shmvec._queue", "shmvec._rows", "shmvec._codec"]),
    ("protocol", ["shmvec._protocol", "shmvec._errors", "shmvec._copyguard", "shmvec._crash", "shmvec._segment",
                  "shmvec._optional", "shmvec._lifeline", "shmvec._containers"]),
    ("values", ["shmvec._actions", "shmvec._layout", "shmvec._masks", "shmvec._pickled_leaves", "shmvec._startup_args"]),
    ("factories", ["shmvec._pickling", "shmvec._seeds", "shmvec._mainload", "shmvec._machine", "shmvec._describe", "shmvec.factories",
                   "shmvec._registrations", "shmvec._options", "shmvec._agents", "shmvec._threads"]),
    ("worker", ["shmvec._worker", "shmvec._worker_envs", "shmvec._worker_pipe", "shmvec._pool"]),
    ("engine parts", ["shmvec._state", "shmvec._link", "shmvec._leases", "shmvec._workers", "shmvec._channel", "shmvec._restarts", "shmvec._calls", "shmvec._placement", "shmvec._engine"]),
    ("front-ends", ["shmvec._frontend", "shmvec.shm_vec_env", "shmvec.shm_vector_env", "shmvec.env_pool",
                    "shmvec.vec_env_pool", "shmvec.multi_agent_vec_env", "shmvec.parallel_env"]),
    ("package", ["shmvec"]),
    ("ray", ["shmvec.ray", "shmvec.ray_pool"]),
    ("integrations", ["shmvec.integrations"]),
    ("tools", ["shmvec.bench", "shmvec._bench", "shmvec.doctor", "shmvec._startup"]),
]


def _layer_of(module: str) -> int:
    """The layer of ``module``: that of its longest listed prefix (``shmvec.ray.actor`` is in ``shmvec.ray``)."""
    best, best_len = None, -1
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = rank, len(name)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py: add it to LAYERS")
    return best


def _modules() -> dict[str, Path]:
    """Every module of the package (``.py`` and ``.pyx``) by dotted name."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*")):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_pkg = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only: never run)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _imports(module: str) -> list[tuple[str, int, str | None]]:
    """(imported shmvec module, line, imported name or None) for every import in ``module``.

    ``from shmvec.x import y`` counts as an import of ``shmvec.x.y`` when that is a module.
    Cython's ``cimport`` lines are read as imports of the ``.pxd`` they name (no layer of their own).
    """
    path = MODULES[module]
    if path.suffix == ".pyx":
        return []  # C-level modules: they cimport .pxd declarations only (checked by the build)
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, str | None]] = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "shmvec" or alias.name.startswith("shmvec."):
                    found.append((alias.name, node.lineno, None))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target != "shmvec" and not target.startswith("shmvec."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:
                    found.append((sub, node.lineno, None))
                else:
                    found.append((target, node.lineno, alias.name))
    return found


def _known(name: str) -> str:
    """``name`` cut back to a module we have (a compiled module is one)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer_of(module)


def test_imports_point_down():
    upward = []
    for module in MODULES:
        mine = _layer_of(module)
        for target, line, _ in _imports(module):
            target = _known(target)
            if target == module or module.startswith(target + ".") and MODULES[target].name == "__init__.py":
                continue  # a package's own __init__ (shmvec.ray.actor importing shmvec.ray's names is not allowed)
            theirs = _layer_of(target)
            if theirs > mine:
                upward.append(f"{module}:{line} imports {target} ({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(dict.fromkeys(upward))


def test_no_import_cycle():
    graph = {m: sorted({_known(t) for t, _, _ in _imports(m)} - {m}) for m in MODULES}
    # A submodule importing its package's __init__ is an import of the package's public names:
    # part of the graph like any other, so shmvec.ray.x must not import shmvec.ray.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, []):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    # The package's own __init__ is imported (as the parent package) by every submodule at run
    # time, but lazily re-exports its front-ends: an edge from it is a cycle only if it is eager.
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_across_modules():
    bad = []
    for module in MODULES:
        path = MODULES[module]
        if path.suffix != ".py":
            continue
        for target, line, name in _imports(module):
            if name is not None and name.startswith("_") and not name.startswith("__"):
                bad.append(f"{module}:{line} imports {name} from {target}")
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(module, node)
                for alias in node.names:
                    if f"{target}.{alias.name}" in MODULES:
                        aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("shmvec.") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    assert not bad, "private names used across modules:\n" + "\n".join(dict.fromkeys(bad))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if MODULES[m].suffix == ".py"))
def test_module_size(module):
    """No module over about 700 lines (the protocol's design document aside)."""
    if module == "shmvec._protocol":
        return
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 720, f"{module} has {lines} lines: split it by responsibility"


def test_class_size():
    """No class over about 450 lines."""
    big = []
    for module, path in MODULES.items():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 460:
                big.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not big, "classes to split:\n" + "\n".join(big)


# The modules of the front-ends layer that hold the helpers two or more faces share (as SB3's base_vec_env.py).
SHARED_FRONTEND = ["shmvec._frontend"]


def _front_end_imports_of_others(module: str) -> list[str]:
    """What ``module`` (a face's module) imports from another face's module, other than a face
    class: the base class it subclasses, or the face it drives (``ShmVecEnvPool`` holds a
    ``ShmEnvPool``), both exported by ``shmvec``.  Anything else (a helper function, a constant,
    the module itself) belongs in a shared-helpers module."""
    faces = set(dict(LAYERS)["front-ends"]) - set(SHARED_FRONTEND)
    bad = []
    for target, line, name in _imports(module):
        target = _known(target)
        if target == module or target not in faces:
            continue
        value = getattr(importlib.import_module(target), name, None) if name else None
        if not (isinstance(value, type) and name in shmvec.__all__):
            bad.append(f"{module}:{line} imports {name or 'the module'} from {target}")
    return bad


def test_front_ends_share_helpers_through_their_own_module():
    """No face's module is another face's helper library: a helper two faces use lives in
    SHARED_FRONTEND (so that ShmParallelEnv, say, does not import the SB3 faces' modules)."""
    assert set(SHARED_FRONTEND) <= set(dict(LAYERS)["front-ends"])
    bad = [line for module in dict(LAYERS)["front-ends"] if module not in SHARED_FRONTEND
           for line in _front_end_imports_of_others(module)]
    assert not bad, "helpers imported from another front-end's module (move them to SHARED_FRONTEND):\n" + "\n".join(bad)


# ---- the engine is the only door (docs/design.md, "Layers"; shmvec._engine, "The door") -----------------
# The layers above the engine, whose modules hold an engine (or a face that holds one) and may use
# only its public surface, never one of its parts.
DOOR_LAYERS = ("front-ends", "package", "ray", "integrations")


def _engine_parts() -> tuple[str, ...]:
    from shmvec._engine import Engine

    return tuple(Engine.PARTS)


def _chains_into_parts(path: Path, parts: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, chain) for every ``X.<part>.<anything>``, ``engine.<part>`` and ``X._engine.<part>`` in ``path``."""
    flagged = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        inner = node.value
        through_part = isinstance(inner, ast.Attribute) and inner.attr in parts
        on_engine = node.attr in parts and (
            (isinstance(inner, ast.Name) and inner.id == "engine")
            or (isinstance(inner, ast.Attribute) and inner.attr == "_engine"))
        if through_part or on_engine:
            flagged.append(node)
    inner_ones = {id(node.value) for node in flagged}  # engine.status within engine.status.fail: one finding
    return sorted((node.lineno, ast.unparse(node)) for node in flagged if id(node) not in inner_ones)


def test_engine_parts_are_declared():
    """``Engine.PARTS`` names every attribute of a built engine that holds an object of the package
    (a part: the workers, the links, the state, ...), but its options (data: shmvec._engine's docstring)."""
    import testenvs

    from shmvec._engine import Engine
    from shmvec._options import Options

    parts = _engine_parts()
    assert "options" not in parts
    held = set()
    for options in ({"on_failure": "restart"}, {"zero_copy": True}):  # (the restarts; the leases)
        engine = Engine(testenvs.spaces_env_fns("box", "discrete", 2), n_workers=2, start_method="fork", **options)
        try:
            held |= {name for name, value in vars(engine).items()
                     if not name.startswith("_") and type(value).__module__.startswith("shmvec.")
                     and not isinstance(value, Options) and not callable(value)}
            assert all(hasattr(engine, name) for name in parts), [name for name in parts if not hasattr(engine, name)]
        finally:
            engine.close()
    assert {"status", "workers", "restarts", "leases"} <= held, f"parts not found: the check reads too little ({held})"
    assert held <= set(parts), f"parts of the engine missing from Engine.PARTS: {sorted(held - set(parts))}"


def test_front_ends_use_only_the_engines_door():
    """No module above the engine reaches into an engine part: ``engine.status.fail``,
    ``self._engine.views.act``, ``record(engine.status, ...)`` are refused; the engine's public
    surface (``engine.fail``, ``engine.rewards``, ``engine.record``, ...) is what a front-end calls."""
    parts = _engine_parts()
    modules = [m for m in MODULES if LAYERS[_layer_of(m)][0] in DOOR_LAYERS and MODULES[m].suffix == ".py"]
    assert "shmvec.env_pool" in modules and "shmvec.ray.vec_env" in modules
    bad = [f"{module}:{line} {chain}" for module in modules for line, chain in _chains_into_parts(MODULES[module], parts)]
    assert not bad, "front-ends reaching past the engine into its parts (use the engine's public surface):\n" + \
        "\n".join(bad)


def test_the_door_check_sees_a_chain():
    """The check finds the chains it refuses (so that a pass above means something)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "face.py"
        path.write_text("def f(self, engine):\n    engine.status.fail(1)\n    record(engine.status, 2)\n"
                        "    self._engine.views.act[()] = 0\n    x = self._engine.links\n"
                        "    engine.fail(3)\n    return engine.options.copy, engine.rewards\n")
        found = _chains_into_parts(path, ("status", "views", "links"))
    assert found == [(2, "engine.status.fail"), (3, "engine.status"), (4, "self._engine.views.act"),
                     (5, "self._engine.links")], found
