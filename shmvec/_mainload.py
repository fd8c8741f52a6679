"""Imported in multiprocessing's fork server only: imports the program's main module there, once.

multiprocessing starts its fork server with ``"__main__"`` to preload, but until CPython's fix
(gh-126631, in releases after 3.12) it never passes the main module's path (the key was renamed
in the preparation data, the server reads the old one), nor ``sys.path``: the server preloads
nothing, and every forkserver worker imports the main script itself as ``__mp_main__``, paying
its top-level imports (torch, SB3) again.  :func:`shmvec._machine.start_forkserver` starts the
server with this module in its preload list and the parts of the preparation data the import
needs (the main module's path or name, ``sys.path``, ``sys.argv``, the working directory) in
the environment variable ``ENV``, for the server alone.  Importing this module then imports the
main module as a worker would (``multiprocessing.spawn.prepare``), once: the workers forked from
the server find it in place, and multiprocessing skips their own import of it.

- A main module that raises there (a script without the ``if __name__ == "__main__":`` guard
  tries to start processes while it is being imported) is left out, silently: each worker then
  imports it as before, and fails as before, with the error that names the guard.
- Output the script printed is flushed, so that no forked worker prints it again.
- ``torch.cuda.is_available()`` at the script's top level would initialise CUDA in the server,
  and CUDA cannot be used in a process forked after that: the server imports the script with
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (unless set), which makes that call ask NVML instead.
- While it imports, the server holds a lifeline to the program (:mod:`shmvec._lifeline`): a
  program killed then does not leave a server importing torch for a minute.
"""

from __future__ import annotations

import json
import os
import sys
from multiprocessing import process, spawn

from shmvec import _lifeline

ENV = "SHMVEC_FORKSERVER_MAIN"
_KEYS = ("sys_path", "sys_argv", "orig_dir", "dir", "init_main_from_name", "init_main_from_path")


def environment(parent_pid: int) -> str | None:
    """The value of ``ENV`` that makes the server import this process's main module, or None
    where there is none to import (``python -c``, a notebook, stdin)."""
    data = spawn.get_preparation_data("forkserver")
    if "init_main_from_name" not in data and "init_main_from_path" not in data:
        return None
    wanted = {k: data[k] for k in _KEYS if k in data}
    wanted["parent_pid"] = parent_pid
    return json.dumps(wanted)


def _import_main(data: dict) -> None:
    _lifeline.arm(data.pop("parent_pid"))
    nvml = "PYTORCH_NVML_BASED_CUDA_CHECK"
    had_nvml = nvml in os.environ
    os.environ.setdefault(nvml, "1")
    process.current_process()._inheriting = True  # as a worker: a process started here raises
    try:
        spawn.prepare(data)
    except (Exception, SystemExit):
        pass  # each worker imports it itself, and reports what it raises
    finally:
        del process.current_process()._inheriting
        if not had_nvml:
            os.environ.pop(nvml, None)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        _lifeline.disarm()


_data = os.environ.pop(ENV, None)
if _data:
    _import_main(json.loads(_data))
