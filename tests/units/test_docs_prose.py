"""What the prose of README.md and docs/*.md names exists, and the figures it quotes from the full
benchmark run are that run's.

- Error and warning classes (backticked ``...Error``, ``...Warning``): shmvec's own are importable
  from ``shmvec`` (Ray's from ``shmvec.ray``); any other is Python's or Gymnasium's.
- Keywords (backticked ``name=``): a parameter of a public function or method of shmvec, or of
  the other library's call the page shows; sb3.md's options table is exactly ``ShmVecEnv``'s
  parameters, and pool.md's list exactly what the pools take.
- Command-line flags (``--flag``, in backticks and in shell blocks): an option of the program they
  follow (``python -m shmvec.bench``, ``shmvec-doctor``, ``python bench/x.py``, ...: read from
  its ``add_argument`` calls); a flag alone belongs to the program the page named last.
- Extras (``.[x]``, ``shmvec[x]``): in pyproject.toml; README's list of them is complete.
- Figures: docs/results.md is what ``python -m shmvec.bench --from-json docs/results.json
  --markdown`` prints; README's table is results.md's figures; the ratios (``1.43x``) of the
  sections that quote the full run are in results.md.

Code blocks themselves are run by tests/integration/test_docs_examples.py.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import inspect
import json
import re
import tomllib
from pathlib import Path

import gymnasium
import pytest

import shmvec
from helpers import REPO_ROOT

ROOT = Path(REPO_ROOT)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Keywords of calls into libraries that are not imported here (or not installed beside the pins),
# each with the call the page shows.
OTHER_KEYWORDS = {
    "runtime_env": "ray.init",
    "num_cpus": "supersuit.concat_vec_envs_v1",
    "base_class": "supersuit.concat_vec_envs_v1",
    "n_step": "tianshou's Collector.collect",
    "n_episode": "tianshou's Collector.collect",
    "break_when_any_done": "torchrl's EnvBase.rollout",
    "gym_env_vectorize_mode": "RLlib's AlgorithmConfig.environment",
    "num_env_runners": "RLlib's AlgorithmConfig.env_runners",
}
# Flags of programs whose options are not read from an argparse parser in this checkout.
OTHER_PROGRAMS = ("pip", "docker", "ray", "pytest", "python -m pytest", "python -m build", "python -m timeit",
                  "python setup.py")


# ---------------------------------------------------------------------------------------------
# Reading the pages
# ---------------------------------------------------------------------------------------------


def page_items(page: Path) -> list[tuple[str, str]]:
    """The page in order as ("span", inline code), ("shell", a command line of a shell block),
    ("prose", a paragraph outside code blocks), ("heading", a heading line)."""
    items: list[tuple[str, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    prose: list[str] = []

    def flush() -> None:
        text = "\n".join(prose)
        for para in re.split(r"\n\s*\n", text):
            items.append(("prose", para))
            for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", para):
                items.append(("span", " ".join(m.group(1).split())))
        prose.clear()

    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*(`{3,}|~{3,})\s*(\w*)", lines[i])
        if re.match(r"#+ ", lines[i]):
            flush()
            items.append(("heading", lines[i]))
            i += 1
            continue
        if not fence:
            prose.append(lines[i])
            i += 1
            continue
        flush()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence.group(1)):
            j += 1
        if fence.group(2) in SHELL:
            body = "\n".join(lines[i + 1:j]).replace("\\\n", " ")
            for line in body.splitlines():
                line = line.strip().removeprefix("$ ")
                if line and not line.startswith("#"):
                    items.append(("shell", line.split(" #")[0]))
        i = j + 1
    flush()
    return items


ITEMS = {page: page_items(page) for page in PAGES}


def spans(kinds: tuple[str, ...] = ("span",)):
    for page, items in ITEMS.items():
        for kind, text in items:
            if kind in kinds:
                yield page, text


def section(page: Path, heading: str) -> str:
    """The text of a page's section, up to the next heading of its level or above."""
    text = page.read_text(encoding="utf-8")
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert m, f"{page.name}: no section {heading!r}"
    end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", re.MULTILINE).search(text, m.end())
    return text[m.end():end.start() if end else len(text)]


# ---------------------------------------------------------------------------------------------
# Error classes
# ---------------------------------------------------------------------------------------------


def shmvec_classes() -> dict[str, str]:
    """Exception and warning classes defined in shmvec's source: name -> module."""
    found = {}
    for path in (ROOT / "shmvec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Warning")):
                found[node.name] = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return found


def static_all(path: Path) -> set[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_error_classes_exist_and_shmvecs_are_exported():
    ours = shmvec_classes()
    ray_all = static_all(ROOT / "shmvec" / "ray" / "__init__.py")
    wrong = []
    for page, span in spans():
        for m in re.finditer(r"\b((?:[A-Za-z_]\w*\.)*)([A-Z]\w*(?:Error|Warning))\b", span):
            prefix, name = m.group(1).rstrip("."), m.group(2)
            where = f"{page.name}: `{span}`"
            if name in ours:
                if ours[name].startswith("shmvec.ray.") or prefix == "shmvec.ray":
                    if name not in ray_all:
                        wrong.append(f"{where}: {name} is not in shmvec.ray.__all__")
                elif name not in shmvec.__all__ or not hasattr(shmvec, name):
                    wrong.append(f"{where}: {name} (defined in {ours[name]}) is not importable from shmvec")
            elif prefix and not prefix.startswith("shmvec"):
                module = importlib.import_module(prefix)
                if not isinstance(getattr(module, name, None), type):
                    wrong.append(f"{where}: {prefix} has no {name}")
            elif not (isinstance(getattr(builtins, name, None), type) or hasattr(gymnasium.error, name)):
                wrong.append(f"{where}: {name} is neither shmvec's, Python's nor Gymnasium's")
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------------------------
# Keywords
# ---------------------------------------------------------------------------------------------


def shmvec_parameters() -> set[str]:
    """Parameter names of the public functions and methods of shmvec's source, and the keywords
    it reads out of ``**kwargs`` (module constants such as ``OPTIONS_KEY = "shmvec_options"``)."""
    names = set()
    for path in (ROOT / "shmvec").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    str(node.value.value).isidentifier() and node.targets[0].id.endswith("_KEY"):
                names.add(node.value.value)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__init__"):
                a = node.args
                names |= {arg.arg for arg in a.posonlyargs + a.args + a.kwonlyargs}
    return names


def library_parameters() -> set[str]:
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    import subprocess

    names = set()
    for f in (PPO.__init__, SAC.__init__, BaseAlgorithm.learn, BaseAlgorithm.load, PPO.learn, make_vec_env,
              make_atari_env, gymnasium.register, gymnasium.make, gymnasium.make_vec, gymnasium.Env.reset,
              gymnasium.vector.VectorEnv.reset, subprocess.Popen):
        names |= set(inspect.signature(f).parameters)
    return names


def test_option_keywords_exist():
    known = shmvec_parameters() | library_parameters() | set(OTHER_KEYWORDS)
    wrong = []
    for page, span in spans():
        if re.match(r"(shmvec\.)?make_env\(", span):
            continue  # make_env passes its keywords to the user's env
        for m in re.finditer(r"(?<![\w.=!<>\-\"'])([a-z_][a-z0-9_]*)=(?!=)", span):
            if m.group(1) not in known:
                wrong.append(f"{page.name}: `{span}`: {m.group(1)}= is no parameter of shmvec or of the call shown")
    assert not wrong, "\n".join(wrong)


def table_names(text: str) -> list[str]:
    """The backticked names in the first column of a markdown table."""
    return [name for row in re.findall(r"^\| ([^|]+) \|", text, re.MULTILINE)
            for name in re.findall(r"`(\w+)`", row)]


def test_sb3_options_table_is_shmvec_vec_envs_parameters():
    documented = table_names(section(ROOT / "docs" / "sb3.md", "Options"))
    actual = set(inspect.signature(shmvec.ShmVecEnv).parameters) - {"env_fns"}
    assert len(documented) == len(set(documented)), f"named twice: {sorted(documented)}"
    assert set(documented) == actual, (f"missing from the table: {sorted(actual - set(documented))}; "
                                       f"no such option: {sorted(set(documented) - actual)}")


def test_pool_options_are_what_the_pools_take():
    from shmvec.shm_vector_env import ENGINE_OPTIONS

    text = " ".join(section(ROOT / "docs" / "pool.md", "`ShmEnvPool`").split())
    bullet = re.search(r"- Options: (.*?) and those of `ShmVecEnv` .*? but (.*?) \(.*?\): (.*?)\. ", text)
    assert bullet, "pool.md: no '- Options: ... and those of `ShmVecEnv` ... but ...: ...' bullet"
    own, refused, listed = (set(re.findall(r"`(\w+)`", g)) for g in bullet.groups())
    params = set(inspect.signature(shmvec.ShmEnvPool).parameters) - {"env_fns", "engine_kwargs"}
    assert own - {"ShmEnvPool"} == params - ENGINE_OPTIONS
    assert listed | refused == ENGINE_OPTIONS and not listed & refused, (
        f"ShmVecEnv's options the page leaves out: {sorted(ENGINE_OPTIONS - listed - refused)}")
    for name in refused:  # refused before any worker starts
        with pytest.raises(TypeError, match=f"ShmEnvPool.__init__\\(\\) got an unexpected keyword argument '{name}'"):
            shmvec.ShmEnvPool([shmvec.make_env("CartPole-v1")] * 2, **{name: True})


# ---------------------------------------------------------------------------------------------
# Command-line flags
# ---------------------------------------------------------------------------------------------


def argparse_flags(path: Path) -> set[str] | None:
    """The long options a script's ``add_argument`` calls define (``--help`` included), or None
    when it has none (not an argparse program)."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags | {"--help"} if flags else None


def program_source(program: str) -> Path | None:
    """The source file of a program as the docs name it, or None for another tool's."""
    scripts = PYPROJECT["project"]["scripts"]
    if program in scripts:
        program = "python -m " + scripts[program].split(":")[0]
    if program.startswith("python -m "):
        # Found without importing it: find_spec("pkg.mod") imports pkg, and some packages patch other
        # libraries when imported (rl_zoo3 replaces Gymnasium's TimeLimit for the whole process).
        top, _, rest = program.removeprefix("python -m ").partition(".")
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.origin:
            return None
        if not rest:
            return Path(spec.origin)
        base = Path(spec.origin).parent.joinpath(*rest.split("."))
        for candidate in (base.with_suffix(".py"), base / "__main__.py"):
            if candidate.exists():
                return candidate
        return None
    path = ROOT / program.removeprefix("python ")
    return path if path.suffix == ".py" and path.exists() else None


_PROGRAM = re.compile(r"(?:python -m [\w.]+|python [\w/.-]+\.py|(?:bench|examples)/\w+\.py|shmvec-\w+|"
                      + "|".join(re.escape(p) for p in OTHER_PROGRAMS) + r")(?=\s|$)")


def test_cli_flags_exist():
    shmvec_programs = [p for p in (ROOT / "shmvec").glob("*.py")] + list((ROOT / "bench").glob("*.py")) + list(
        (ROOT / "examples").glob("*.py"))
    any_flag = set().union(*(argparse_flags(p) or set() for p in shmvec_programs))
    wrong = []
    for page, items in ITEMS.items():
        for kind, text in items:
            if kind == "heading" or text is items[0][1]:  # a section that names no program: any of shmvec's
                flags_of: set[str] | None = any_flag
                program = "a program of shmvec"
            if kind in ("prose", "heading"):
                continue
            for part in re.split(r"&&|\|\||;|\|(?!\|)", text):
                m = _PROGRAM.search(part)
                if m:
                    program = m.group()
                    source = program_source(program.replace("bench/", "python bench/").replace(
                        "examples/", "python examples/") if not program.startswith(("python", "shmvec")) else program)
                    flags_of = argparse_flags(source) if source else None
                    part = part[m.end():]
                if flags_of is None:
                    continue
                for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", part):
                    if flag not in flags_of:
                        wrong.append(f"{page.name}: `{text}`: {flag} is not an option of {program}")
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------------------------
# Extras
# ---------------------------------------------------------------------------------------------

EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])


def test_extras_exist():
    wrong = []
    for page in PAGES:
        for m in re.finditer(r"(?:\bshmvec|(?<![\w\]])\.)\[([\w,\s-]+)\]", page.read_text(encoding="utf-8")):
            for extra in m.group(1).split(","):
                if extra.strip() not in EXTRAS:
                    wrong.append(f"{page.name}: {m.group()}: no extra {extra.strip()!r} in pyproject.toml")
    assert not wrong, "\n".join(wrong)


def test_readme_lists_every_extra():
    m = re.search(r"\(extras: ([^)]*)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert m, "README.md: no '(extras: ...)' list"
    assert set(re.findall(r"`([\w-]+)`", m.group(1))) == EXTRAS


# ---------------------------------------------------------------------------------------------
# Figures of the full run
# ---------------------------------------------------------------------------------------------

RESULTS_MD = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
# Sections that quote the full run (docs/results.md) in their prose.
QUOTING_THE_FULL_RUN = [("README.md", "How fast"), ("docs/benchmarks.md", "Where shmvec loses")]


def test_results_md_is_what_the_bench_prints_from_results_json():
    from shmvec.bench import format_markdown

    results = json.loads((ROOT / "docs" / "results.json").read_text())
    assert format_markdown(results).strip() == RESULTS_MD.strip(), (
        "docs/results.md is not generated from docs/results.json: run "
        "python -m shmvec.bench --from-json docs/results.json --markdown > docs/results.md")


def results_cells() -> dict[tuple[str, str, str], str]:
    """(env, n_envs, column) -> ratio, from results.md's throughput and where-users-train tables."""
    cells = {}
    tables = re.findall(r"((?:^\|.*\|\n)+)", RESULTS_MD, re.MULTILINE)
    for table in tables:
        rows = [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in table.strip().splitlines()]
        head, body = rows[0], rows[2:]
        if head[:2] == ["env", "n_envs"]:
            for row in body:
                for col, cell in zip(head[2:], row[2:]):
                    m = re.search(r"\(([\d.]+)\)", cell)
                    if m:
                        cells[(row[0], row[1], col)] = m.group(1)
        elif head[:3] == ["situation", "env", "n_envs"]:
            for row in body:
                cells[(row[1], row[2], f"{row[0]}: {head[3]}")] = row[3]
    return cells


def test_readme_table_is_the_full_runs():
    text = section(ROOT / "README.md", "How fast")
    table = re.search(r"((?:^\|.*\|\n)+)", text, re.MULTILINE).group(1)
    rows = [[c.strip().replace("*", "").replace("`", "") for c in line.strip("|").split("|")]
            for line in table.strip().splitlines()]
    columns = {"ShmVecEnv, policy in the loop": "policy: ShmVecEnv x DummyVecEnv",
               "ShmVecEnv, a core busy": "busy: ShmVecEnv x DummyVecEnv"}
    cells = results_cells()
    wrong = []
    for row in rows[2:]:
        env = row[0].split(" (")[0]
        for col, value in zip(rows[0][2:], row[2:]):
            col = columns.get(col, col)
            if value == "-":
                continue
            expected = cells.get((env, row[1], col))
            if expected != value:
                wrong.append(f"{env} x {row[1]}, {col}: README {value}, results.md {expected}")
    assert not wrong, "README's table is not docs/results.md's figures:\n" + "\n".join(wrong)


@pytest.mark.parametrize("page, heading", QUOTING_THE_FULL_RUN)
def test_ratios_quoting_the_full_run_are_in_results_md(page, heading):
    figures = set(re.findall(r"\d+\.\d+", RESULTS_MD))
    text = re.sub(r"^\|.*$", "", section(ROOT / page, heading), flags=re.MULTILINE)  # tables: above
    missing = [m.group() for m in re.finditer(r"(?<![\w.])(\d+\.\d+)x\b", text) if m.group(1) not in figures]
    assert not missing, f"{page} '{heading}': {missing} are not figures of docs/results.md"
