"""Every code block of README.md and docs/*.md runs as written, as a user would paste it.

The test finds the blocks itself (fenced with three backticks or tildes), so an example cannot be
added without being run. By the block's language:

- ``python``: a complete program. It is written to ``example.py`` in a fresh temporary directory
  and run there in its own interpreter (``PYTHONPATH``: the shmvec these tests import), under a
  timeout; it must exit with status 0. One that imports a library not installed here (an optional
  one: SB3, Tianshou, ...) is skipped, naming it.
- ``bash``, ``sh``, ``shell``: every line is a command (``#`` comments and ``\\`` continuations as
  in bash), run by ``bash -e`` in a fresh temporary directory with this interpreter's ``python``
  and shmvec's console scripts first on ``PATH``; it must exit with status 0.
  ``console``: the lines that start with ``$ `` are the commands, the lines after each its output.
- ``text``: right after a ``python`` or shell block (nothing but blank lines between), what that
  block prints; anywhere else an illustration (an error message, a crash report), shown only.
- anything else, or no language: the test fails.

Output: the program's stdout must match the page's ``text`` block line for line, with these
allowances (numbers may differ; shapes, names and messages must not):

- a number written with a decimal point, an exponent or thousands separators (``0.57``,
  ``-37.61``, ``1e-05``, ``104,784``) matches any number; a plain integer (a shape, a count, an
  index) must be equal;
- runs of spaces match any run of spaces (table columns move with the numbers);
- ``...`` matches any text, across lines too.

A block that cannot run here (a multi-node Ray cluster, a 20-minute benchmark, an install from
the network) has, on the line before its opening fence, ``<!-- docs-test: skip (reason) -->``:
it is reported as skipped with that reason (``pytest -ra`` lists them), and
``test_block_counts`` prints how many blocks ran and how many are marked, with the reasons
(``pytest -s``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import OPTIONAL_MODULES
from helpers import REPO_ROOT, pythonpath

ROOT = Path(REPO_ROOT)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python"}
SHELL = {"bash", "sh", "shell", "console"}
TEXT = {"text"}
TIMEOUT_S = 120.0

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<what>.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip \((?P<reason>.+)\)$")


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None = None  # the reason, if marked
    end: int = 0  # index of the line after the closing fence
    output: "Block | None" = None  # the text block that shows what this block prints
    is_output: bool = False

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def find_blocks(page: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a page, and what is wrong with its docs-test marks."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    marks: dict[int, str] = {}  # line index of a mark -> what it says
    i = 0
    while i < len(lines):
        m = _MARK.match(lines[i])
        if m:
            marks[i] = m.group("what")
        elif "docs-test" in lines[i]:
            problems.append(f"{page.name}:{i + 1}: a docs-test mark must be `<!-- docs-test: skip (reason) -->`")
        f = _FENCE.match(lines[i])
        if not f:
            i += 1
            continue
        fence, indent = f.group("fence"), len(f.group("indent"))
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            j += 1
        body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1:j]]
        block = Block(page, i + 1, f.group("info").strip().split(" ")[0].lower(), textwrap.dedent("\n".join(body)),
                      end=j + 1)
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k in marks:
            what = marks.pop(k)
            s = _SKIP.match(what)
            if s is None:
                problems.append(f"{page.name}:{k + 1}: unknown docs-test mark {what!r} (expected `skip (reason)`)")
            elif block.lang in TEXT:
                problems.append(f"{page.name}:{k + 1}: a text block is not run, so it cannot be skipped")
            else:
                block.skip = s.group("reason")
        if block.lang in TEXT and blocks and blocks[-1].lang in PYTHON | SHELL and blocks[-1].output is None \
                and all(not line.strip() for line in lines[blocks[-1].end:i]):
            blocks[-1].output = block
            block.is_output = True
        blocks.append(block)
        i = j + 1
    for k, what in marks.items():
        problems.append(f"{page.name}:{k + 1}: docs-test mark {what!r} is not on the line before a block's fence")
    return blocks, problems


BLOCKS: list[Block] = []
MARK_PROBLEMS: list[str] = []
for _page in PAGES:
    _blocks, _problems = find_blocks(_page)
    BLOCKS += _blocks
    MARK_PROBLEMS += _problems
RUNNABLE = [b for b in BLOCKS if b.lang in PYTHON | SHELL]

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+)"
_LOOSE_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)")


def output_pattern(expected: str) -> re.Pattern[str]:
    """The regular expression a program's output must match in full (see the module docstring)."""
    parts: list[str] = []
    for line in expected.strip("\n").splitlines():
        out, pos = [], 0
        line = line.strip()
        for m in re.finditer(r"\.\.\.|\s+|" + _LOOSE_NUMBER.pattern, line):
            out.append(re.escape(line[pos:m.start()]))
            token = m.group()
            out.append(r".*?" if token == "..." else r"[ \t]+" if token.isspace() else rf"(?:{_NUMBER}|nan|inf)")
            pos = m.end()
        out.append(re.escape(line[pos:]))
        parts.append("".join(out))
    return re.compile(r"[ \t]*\n[ \t]*".join(parts), re.DOTALL)


def check_output(expected: str, actual: str, where: str) -> None:
    actual = "\n".join(line.strip() for line in actual.strip("\n").splitlines())
    assert output_pattern(expected).fullmatch(actual), (
        f"{where}: the output differs from the page's.\n--- the page shows:\n{expected}\n--- the program printed:\n{actual}")


def run(argv: list[str], cwd: Path, where: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{where}: still running after {TIMEOUT_S:.0f} s (make the example lighter, or mark it)\n"
                    f"{e.stdout}\n{e.stderr}")
    if proc.returncode != 0:
        missing = missing_in_traceback(proc.stderr)
        if missing:  # imported further down (shmvec.integrations.torchrl imports torchrl when used)
            pytest.skip(f"{where}: needs {missing}, which is not installed here")
    assert proc.returncode == 0, f"{where} exited with status {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


# The last line of a traceback that says an optional library is missing: Python's own, or shmvec's
# (shmvec._optional: "ShmVecEnv needs stable-baselines3, which is not installed ...").
_NOT_INSTALLED = re.compile(r"ModuleNotFoundError: (?:No module named '([\w.]+)'|\w+ needs ([\w-]+), which is not installed)")


def missing_in_traceback(stderr: str) -> str | None:
    """The optional library whose absence ended the program (the suite's full run installs them), or None."""
    lines = stderr.strip().splitlines()
    m = _NOT_INSTALLED.match(lines[-1]) if lines else None
    if m is None:
        return None
    name = (m.group(1) or m.group(2)).split(".")[0]
    module = name.replace("-", "_")
    return name if module in OPTIONAL_MODULES and importlib.util.find_spec(module) is None else None


def missing_modules(code: str) -> list[str]:
    """The top-level modules a program imports that are not installed here."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(name for name in names if importlib.util.find_spec(name) is None)


def console_commands(code: str) -> list[tuple[str, str]]:
    """A console block's (command, output) pairs."""
    pairs: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in pairs]


def test_every_block_has_a_known_language():
    wrong = [f"{b.where}: {b.lang or 'no language'}" for b in BLOCKS if b.lang not in PYTHON | SHELL | TEXT]
    assert not wrong, ("blocks without a language this test knows (python, bash, sh, shell, console, text):\n"
                       + "\n".join(wrong))


def test_marks_are_well_formed():
    assert not MARK_PROBLEMS, "\n".join(MARK_PROBLEMS)


def test_block_counts():
    marked = [b for b in RUNNABLE if b.skip]
    shown = [b for b in BLOCKS if b.lang in TEXT and not b.is_output]
    print(f"\ndocs examples: {len(RUNNABLE) - len(marked)} blocks run "
          f"({sum(b.output is not None and not b.skip for b in RUNNABLE)} with their output checked), "
          f"{len(marked)} marked not to run, {len(shown)} text blocks shown only")
    for b in marked:
        print(f"  marked: {b.where} ({b.lang}): {b.skip}")
    assert len(RUNNABLE) - len(marked) > 0


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.where}-{b.lang}" for b in RUNNABLE])
def test_block(block: Block, tmp_path: Path):
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    if block.lang in PYTHON:
        missing = missing_modules(block.code)
        if missing:  # an optional library (the suite's full run installs them all)
            pytest.skip(f"{block.where}: needs {', '.join(missing)}, which is not installed here")
        (tmp_path / "example.py").write_text(block.code + "\n", encoding="utf-8")
        proc = run([sys.executable, "example.py"], tmp_path, block.where)
        if block.output is not None:
            check_output(block.output.code, proc.stdout, block.where)
    elif block.lang == "console":
        commands = console_commands(block.code)
        assert commands, f"{block.where}: a console block without a `$ ` command"
        for cmd, out in commands:
            proc = run(["bash", "-e", "-o", "pipefail", "-c", cmd], tmp_path, f"{block.where}: {cmd}")
            if out.strip():
                check_output(out, proc.stdout, f"{block.where}: {cmd}")
    else:
        proc = run(["bash", "-e", "-o", "pipefail", "-c", block.code], tmp_path, block.where)
        if block.output is not None:
            check_output(block.output.code, proc.stdout, block.where)


@pytest.mark.parametrize("expected, actual, ok", [
    ("obs (8, 18) float32", "obs (8, 18) float32", True),
    ("obs (8, 18) float32", "obs (8, 17) float32", False),
    ("reward -37.61 after 30,720 steps", "reward -12.5 after 1,024 steps", True),
    ("name   steps/s\nShmVecEnv   104,784", "name steps/s\nShmVecEnv        98,001", True),
    ("WorkerDiedError: worker 1 ...", "WorkerDiedError: worker 1 (envs 4..7) died\nmore", True),
    ("WorkerDiedError: worker 1 ...", "ValueError: worker 1", False),
    ("3 envs", "4 envs", False),
])
def test_output_matching(expected, actual, ok):
    """The allowances of the module docstring, and no more."""
    assert bool(output_pattern(expected).fullmatch(actual)) is ok


def test_find_blocks_reads_marks_and_outputs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "<!-- docs-test: skip (needs a cluster) -->", "```python", "import ray", "```", "",
        "```python", "print(1)", "```", "", "```text", "1", "```",
        "Prose.", "```text", "an illustration", "```",
        "```", "no language", "```",
        "<!-- docs-test: skip (nothing follows) -->", "",
        "Prose.", "<!-- docs-test: run -->", "```console", "$ echo hi", "hi", "```",
    ]))
    blocks, problems = find_blocks(page)
    assert [(b.lang, b.skip, b.is_output) for b in blocks] == [
        ("python", "needs a cluster", False), ("python", None, False), ("text", None, True),
        ("text", None, False), ("", None, False), ("console", None, False)]
    assert blocks[1].output is blocks[2] and blocks[3].output is None
    assert len(problems) == 2 and "unknown docs-test mark 'run'" in problems[0] and "not on the line before" in problems[1]
    assert console_commands(blocks[5].code) == [("echo hi", "hi")]
