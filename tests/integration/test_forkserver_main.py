"""The fork server imports the program's main module once, and its workers fork with it imported (issue 37, item 3).

Python 3.11's forkserver preloads nothing (it never gets the main module's path): each worker
imported the script itself as ``__mp_main__``, paying its top-level imports (torch, SB3) again.
A script records each import of itself in a log; built with three forkserver workers, it must
be imported twice in all (as ``__main__`` by Python, once as ``__mp_main__`` by the server),
whether it is run as a file (from another directory, with a sibling module it imports, and
``sys.argv`` read at its top level, as the workers see them) or with ``python -m``.  A script
without the main guard still gets the error that names the guard.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, pythonpath

SCRIPT = '''
import os
import sys

import sibling  # a module beside the script, found through the script's folder on sys.path

with open(os.environ["SHMVEC_IMPORT_LOG"], "a") as f:
    f.write(f"{{__name__}} {{sys.argv[-1]}} {{os.getpid()}}\\n")

import shmvec
import testenvs


def build():
    env = shmvec.ShmVectorEnv([testenvs.make_bare_env] * 3, n_workers=3, start_method="forkserver")
    env.reset()
    env.close()
    print("built")


{guarded}
'''


def _run(tmp_path, guarded: bool, as_module: bool = False):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sibling.py").write_text("VALUE = 1\n")
    (folder / "train.py").write_text(SCRIPT.format(guarded='if __name__ == "__main__":\n    build()' if guarded
                                                   else "build()  # no main guard"))
    log = tmp_path / "imports.log"
    env = dict(os.environ, PYTHONPATH=pythonpath(TESTS_DIR, *([folder] if as_module else [])),
               SHMVEC_IMPORT_LOG=str(log))
    cmd = [sys.executable, *(["-m", "train"] if as_module else [str(folder / "train.py")]), "the-arg"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=str(tmp_path), env=env)
    return proc, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("as_module", [False, True], ids=["script file", "python -m"])
def test_the_fork_server_imports_the_main_module_once(tmp_path, as_module):
    proc, imports = _run(tmp_path, guarded=True, as_module=as_module)
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-3000:]
    names = sorted(line.split()[0] for line in imports)
    assert names == ["__main__", "__mp_main__"], imports  # Python's own, then the server's: no worker's
    assert all(line.split()[1] == "the-arg" for line in imports), imports  # sys.argv as the workers see it


def test_a_script_without_a_main_guard_still_names_the_guard_under_forkserver(tmp_path):
    proc, imports = _run(tmp_path, guarded=False)
    assert proc.returncode != 0
    assert "WorkerDiedError" in proc.stderr and "exit code 1" in proc.stderr, proc.stderr[-3000:]
    assert 'if __name__ == "__main__":' in proc.stderr.splitlines()[-1], proc.stderr[-3000:]
