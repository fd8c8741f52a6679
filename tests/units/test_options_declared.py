"""The engine's options are declared once (``shmvec._options.OPTIONS``), and everything else agrees.

- Each front-end's hand-written signature names exactly the declared options it takes, with the
  declared defaults and annotations (the typed signatures users and IDEs read stay explicit; a new
  option in the declaration fails here until each front-end has it).  Faces that take some options
  through ``**kwargs`` pass those to an engine that accepts exactly the declared ones.
- ``Options.build``'s signature is the declaration's (its defaults, but ``zero_copy`` off for the
  faces that do not offer it).
- ``Options.given`` (what ``describe()`` records) holds every declared option, in its order.
- docs/sb3.md's options table is :func:`shmvec._options.options_table`'s rendering.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import shmvec
from helpers import REPO_ROOT
from shmvec._options import BUILD_DEFAULTS, BY_NAME, OPTIONS, Options, options_table, plain_option

DECLARED = [o.name for o in OPTIONS]
REGENERATE = ("python -c 'from shmvec._options import options_table; print(options_table())' and paste it over "
              "the table of docs/sb3.md, \"## Options\"")


def _parameters(func) -> list[inspect.Parameter]:
    return list(inspect.signature(func).parameters.values())


def _annotation(param: inspect.Parameter) -> str:
    a = param.annotation
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _disagreements(params: list[inspect.Parameter], where: str) -> list[str]:
    """Each declared option among ``params`` whose default or annotation is not the declared one."""
    wrong = []
    for p in params:
        option = BY_NAME.get(p.name)
        if option is None:
            continue
        if p.default is inspect.Parameter.empty or p.default != option.default \
                or type(p.default) is not type(option.default):
            wrong.append(f"{where}: {p.name}'s default is {p.default!r}, declared {option.default!r}")
        if _annotation(p) != option.annotation:
            wrong.append(f"{where}: {p.name}: {_annotation(p)}, declared {option.annotation}")
    return wrong


def _var_keyword(params: list[inspect.Parameter]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


# The front-ends that name every option in their own signature, after these leading parameters (in
# the declaration's order, since they may be passed by position).
EXPLICIT = {"ShmVecEnv": ["self", "env_fns"], "ShmMultiAgentVecEnv": ["self", "env_fns", "pad"]}


@pytest.mark.parametrize("face", sorted(EXPLICIT))
def test_explicit_signatures_name_every_declared_option_in_order(face):
    params = _parameters(getattr(shmvec, face).__init__)
    lead = EXPLICIT[face]
    names = [p.name for p in params]
    assert names[:len(lead)] == lead, f"{face}.__init__ begins {names[:len(lead)]}, not {lead}"
    assert names[len(lead):] == DECLARED, (
        f"{face}.__init__'s options are {names[len(lead):]}; shmvec._options.OPTIONS declares {DECLARED}")
    assert not _var_keyword(params)
    assert not _disagreements(params, f"{face}.__init__"), "\n".join(_disagreements(params, f"{face}.__init__"))


# The Gymnasium-style faces: some options by name, the others through **engine_kwargs, which they
# check against ENGINE_OPTIONS (read from Options.build's signature); the pools refuse copy and
# zero_copy (their results are always arrays of their own).
KWARGS_FACES = {"ShmVectorEnv": set(), "ShmEnvPool": {"copy", "zero_copy"}}


@pytest.mark.parametrize("face", sorted(KWARGS_FACES))
def test_faces_with_engine_kwargs_name_declared_options_as_declared(face):
    from shmvec.shm_vector_env import ENGINE_OPTIONS

    params = _parameters(getattr(shmvec, face).__init__)
    named = {p.name for p in params} & set(DECLARED)
    meant = set(DECLARED) - KWARGS_FACES[face]
    assert named <= meant, f"{face}.__init__ names {sorted(named - meant)}, which it is not meant to take"
    assert _var_keyword(params), f"{face}.__init__ takes no **engine_kwargs: it would miss {sorted(meant - named)}"
    assert set(ENGINE_OPTIONS) == set(DECLARED)
    assert not _disagreements(params, f"{face}.__init__"), "\n".join(_disagreements(params, f"{face}.__init__"))


def test_the_pool_refuses_what_it_is_not_meant_to_take_before_any_worker_starts():
    fns = [shmvec.make_env("CartPole-v1")] * 2
    for name in [*KWARGS_FACES["ShmEnvPool"], "no_such_option"]:
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            shmvec.ShmEnvPool(fns, **{name: True})


# Faces that pass every option on as **kwargs (to ShmEnvPool, or to the engine), naming none.
FORWARDING = {"ShmVecEnvPool": "kwargs", "ShmParallelEnv": "options"}


@pytest.mark.parametrize("face", sorted(FORWARDING))
def test_forwarding_faces_name_no_option_of_their_own(face):
    params = _parameters(getattr(shmvec, face).__init__)
    assert not {p.name for p in params} & set(DECLARED), f"{face}.__init__ names an option: check it here as well"
    assert [p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD] == [FORWARDING[face]]


def test_build_signature_is_the_declaration():
    params = _parameters(Options.build)
    names = [p.name for p in params]
    assert names == ["env_fns", "autoreset", "public_name", "restartable", *DECLARED]
    declared = [p for p in params if p.name in BY_NAME]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in declared)
    assert {p.name: p.default for p in declared} == dict(BUILD_DEFAULTS)
    assert {p.name: _annotation(p) for p in declared} == {o.name: o.annotation for o in OPTIONS}
    # The one default of its own: the faces that offer zero_copy pass theirs; the pools get none.
    assert {n: v for n, v in BUILD_DEFAULTS.items() if v != BY_NAME[n].default} == {"zero_copy": False}


def test_build_refuses_an_undeclared_option_as_python_would():
    with pytest.raises(TypeError, match=r"Options.build\(\) got an unexpected keyword argument 'no_such_option'"):
        Options.build([shmvec.make_env("CartPole-v1")], no_such_option=1)


def test_each_declared_default_passes_its_own_check():
    for option in OPTIONS:
        if option.check is not None:
            assert option.check(option.name, option.default) == option.default, option.name


def test_given_holds_every_declared_option_in_order():
    options, _ = Options.build([shmvec.make_env("CartPole-v1")] * 2, n_workers=1, spin_us=0, start_method="fork",
                               max_restarts=float("inf"), timeout=3)
    assert list(options.given) == DECLARED
    assert options.given["max_restarts"] is None and options.given["timeout"] == 3.0  # as checked
    assert options.given["spin_us"] == 0 and options.given["zero_copy"] is False  # as passed; build's default


def test_described_cpu_affinity_is_plain_data():
    assert plain_option("cpu_affinity", [{1, 0}, 2, (3,)]) == [[0, 1], 2, [3]]
    assert plain_option("cpu_affinity", True) is True
    assert plain_option("n_actors", (1, 2)) == (1, 2)  # not declared (RayShmVecEnv's): as it is


def test_shm_vec_env_documents_every_declared_option():
    doc = shmvec.ShmVecEnv.__doc__ or ""
    missing = [name for name in DECLARED if f":param {name}:" not in doc]
    assert not missing, f"ShmVecEnv's docstring has no :param for {missing}"


def _docs_table(text: str) -> str:
    start = text.index("| option | default | what |")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_the_docs_table_is_the_declarations_rendering():
    page = Path(REPO_ROOT) / "docs" / "sb3.md"
    text = page.read_text(encoding="utf-8")
    section = re.search(r"^## Options\n(.*?)^## ", text, re.MULTILINE | re.DOTALL)
    assert section, "docs/sb3.md has no '## Options' section"
    assert _docs_table(section.group(1)) == options_table(), f"docs/sb3.md's options table is stale: run {REGENERATE}"
