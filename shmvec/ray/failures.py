"""How a failed actor call becomes a shmvec error: a dead actor, an env's exception, a timeout.

Ray hands the driver one of its own exceptions per failed call: ``RayActorError`` (the actor's
process or node is gone), ``RayTaskError`` (the actor's method raised; the original exception is
its ``cause``) or, from our own bounded waits, ``GetTimeoutError``.  This module turns them into
the errors a local ShmVecEnv raises: :class:`RayActorDiedError` (a ``WorkerDiedError``) naming
the actor, its node and its envs; the env's exception as itself, with the actor's traceback as
its cause and a note saying where it ran; ``WorkerTimeoutError`` naming the actors waited for.

The actor's half is :func:`keeps_traceback`: Ray sends an exception without its chain, so the
actor attaches the formatted traceback (the ShmVecEnv worker's included) and :func:`unwrap`
puts it back as ``__cause__``.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any

import ray.exceptions

from shmvec._errors import (
    BrokenVecEnvError,
    RemoteTraceback,
    ShmVecEnvError,
    WorkerDiedError,
    WorkerTimeoutError,
    envs_named,
)

__all__ = ["RayActorDiedError", "BROKEN_HINT", "CALL_HINT", "RESTARTED_HINT", "keeps_traceback", "unwrap",
           "engine_failed", "failure_reason", "failure_error"]

BROKEN_HINT = "The vec env cannot go on: call close() and build a new one."
CALL_HINT = "The vec env is still usable."
RESTARTED_HINT = (
    "on_failure='restart' replaced it: a new actor built and reset its envs, whose next step_wait() reports their "
    "episodes as truncated (info['shmvec_restarted']). The call was not retried (its effect cannot be replayed "
    "safely on new envs): call it again if you need it. The vec env is still usable."
)
# The attribute by which an exception carries the actor's formatted traceback across Ray.
_TRACEBACK_ATTR = "_shmvec_traceback"


class RayActorDiedError(WorkerDiedError):
    """A Ray actor of a :class:`RayShmVecEnv` died (its process was killed, or its node was lost).

    ``worker`` is the actor's index, ``env_indices`` the envs it held; ``node_id``,
    ``node_ip`` and ``pid`` say where it ran.
    """

    def __init__(self, message: str, worker: int | None = None, env_indices: range | None = None,
                 node_id: str | None = None, node_ip: str | None = None, pid: int | None = None) -> None:
        super().__init__(message, worker=worker, env_indices=env_indices, exitcode=None)
        self.node_id = node_id
        self.node_ip = node_ip
        self.pid = pid


def keeps_traceback(method: Callable) -> Callable:
    """Attaches the actor's formatted traceback (chained causes included, so the ShmVecEnv
    worker's too) to an exception leaving ``method``: Ray sends the exception, not its chain."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            try:
                setattr(exc, _TRACEBACK_ATTR, "".join(traceback.format_exception(exc)))
            except Exception:  # noqa: BLE001 - an exception type that refuses attributes
                pass
            raise

    return wrapper


def unwrap(exc: ray.exceptions.RayTaskError, hint: str) -> BaseException:
    """The exception an actor raised, as itself, with the actor's traceback as its cause."""
    cause = getattr(exc, "cause", None)
    if not isinstance(cause, BaseException):
        return ShmVecEnvError(f"{exc}\n{hint}")
    tb = cause.__dict__.pop(_TRACEBACK_ATTR, None)
    cause.__cause__ = RemoteTraceback(tb or str(exc))
    return cause


def engine_failed(exc: BaseException) -> bool:
    """Whether a call failed because the actor's own engine can go on no more (one of its worker
    processes died or hung, or an earlier failure broke it): replacing the actor repairs that."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    return isinstance(cause, (WorkerDiedError, WorkerTimeoutError, BrokenVecEnvError))


def failure_reason(k: int, sl: range, info: dict[str, Any], exc: BaseException, command: str,
                   call_timeout: float | None) -> str:
    """What failed in actor ``k`` (envs ``sl``, placed as ``info`` says), in one line, for
    ``info["shmvec_restarted"]`` and the warning."""
    where = f"actor {k} ({envs_named(sl)}, node {info.get('node_ip')}, pid {info.get('pid')})"
    if isinstance(exc, ray.exceptions.RayActorError):
        return f"{where} died during {command}"
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return f"{where} did not answer {command} within {call_timeout:g} s"
    cause = getattr(exc, "cause", None) or exc
    return f"{where}: {type(cause).__name__} during {command}: {cause}"


def failure_error(failures: dict[int, BaseException], actors: list[int], command: str, slices: list[range],
                  actor_info: list[dict[str, Any]], call_timeout: float | None, broken: bool,
                  restarted: bool = False) -> tuple[BaseException, bool]:
    """The error that says most about ``failures`` ({position in actors: Ray's exception}), and
    whether it breaks the group.

    A dead actor first (it names the node), then an env's exception, then a timeout.
    ``broken``: the call leaves the actors in unknown states whatever failed.  ``restarted``:
    the dead and late actors were replaced already (a rare call in restart mode).
    """
    hint = BROKEN_HINT if broken else CALL_HINT
    dead = [(actors[p], e) for p, e in failures.items() if isinstance(e, ray.exceptions.RayActorError)]
    late = [actors[p] for p, e in failures.items() if isinstance(e, ray.exceptions.GetTimeoutError)]
    env_errors = [(actors[p], e) for p, e in failures.items() if isinstance(e, ray.exceptions.RayTaskError)]
    others = [e for e in failures.values()
              if not isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                                    ray.exceptions.RayTaskError))]
    err: BaseException
    if dead:
        err = _died(dead, slices, actor_info, command, RESTARTED_HINT if restarted else BROKEN_HINT)
    elif env_errors:
        k, e = env_errors[0]
        err = _located(unwrap(e, RESTARTED_HINT if restarted and engine_failed(e) else hint), k, slices[k],
                       actor_info[k])
    elif late:
        envs = envs_named(i for k in late for i in slices[k])
        err = WorkerTimeoutError(
            f"{command}: actors {late} ({envs}) did not answer within {call_timeout:g} s. "
            + (RESTARTED_HINT if restarted else
               "An env may hang, or the cluster lacks the resources to place them (see `ray status`); "
               "call close() (it kills them) and build a new vec env.")
        )
    else:
        err = ShmVecEnvError(f"{command}: Ray failed: {type(others[0]).__name__}: {others[0]}. {hint}")
        err.__cause__ = others[0]
    if err.__cause__ is None:
        err.__suppress_context__ = True  # Ray's exception says nothing more than ours
    return err, broken or (bool(dead or late) and not restarted)


def _located(exc: BaseException, k: int, sl: range, info: dict[str, Any]) -> BaseException:
    """Notes where ``exc`` (raised in actor k, which holds envs ``sl``) came from; its ``env_indices`` become
    global."""
    local = getattr(exc, "env_indices", None)
    if isinstance(local, range):
        exc.env_indices = range(local.start + sl.start, local.stop + sl.start)
    elif isinstance(local, (list, tuple)):
        exc.env_indices = [i + sl.start for i in local]
    where = f" on node {info['node_ip']} ({info['node_id'][:12]}...)" if info else ""
    exc.add_note(
        f"shmvec.ray: raised in actor {k}{where}, which holds {envs_named(sl)}: "
        f"its local env j is env {sl.start} + j of this RayShmVecEnv."
    )
    return exc


def _died(dead: list[tuple[int, BaseException]], slices: list[range], actor_info: list[dict[str, Any]],
          command: str, hint: str) -> RayActorDiedError:
    lines = []
    for k, _ in dead:
        sl, info = slices[k], actor_info[k]
        where = (f"on node {info['node_ip']} (node id {info['node_id']}), pid {info['pid']}" if info
                 else "while being placed")
        lines.append(f"actor {k} {where}, {envs_named(sl)}")
    k0, cause = dead[0]
    info = actor_info[k0]
    reason = str(cause).strip().splitlines()
    err = RayActorDiedError(
        f"Ray actor died during {command}: " + "; ".join(lines) + ". "
        f"Ray says: {' / '.join(s.strip() for s in reason[:8])}. "
        "The node may have been lost, its process killed (the OOM killer, a native crash) or the actor "
        "killed with ray.kill. " + hint,
        worker=k0, env_indices=slices[k0],
        node_id=info.get("node_id"), node_ip=info.get("node_ip"), pid=info.get("pid"),
    )
    err.__cause__ = cause
    return err
