"""``python -m shmvec.bench --preset scaling``: env steps/s against workers, from one to the cores.

For each env and ``n_envs`` (default CartPole-v1, busy-200us, image-84x84x4 at 64, 256 and 1,024
envs), side by side in alternating rounds as the rest of the benchmark:

- backends that take a number of workers (``ShmVecEnv``, and EnvPool's threads where it is
  installed: its own C++ CartPole only) at 1, 2, 4, ... workers and the cores
  (:func:`worker_counts`); the cores are the CPU budget (:func:`shmvec._machine.cpu_budget`), or
  ``--workers``;
- ``DummyVecEnv``: every env in this process, one worker;
- ``SubprocVecEnv`` and ``AsyncVectorEnv``: one process per env, so they are **capped** at
  ``max_processes`` processes (default 2 x the cores): past the cap they step ``max_processes``
  envs, not ``n_envs``, and the table and the figure say so.  Hundreds of processes on a few
  cores would measure the scheduler, and take minutes to start.

The limit at ``w`` workers is ``min(w, cores)`` x the steps/s of one env in a bare loop (measured
in the same run); "x 1 worker" is each swept backend against itself at one worker (median of the
per-round ratios): a curve that does not drop as workers are added stays at or above the one
before.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shmvec._bench import backends as B
from shmvec._bench.envs import check_env_name
from shmvec._bench.measures import bare_loop_sps, cores, median_ratio, side_by_side
from shmvec._bench.session import LocalBackend, Progress, describe_error, machine

RESULTS_VERSION = 1
KIND = "scaling"
REFERENCE = "DummyVecEnv"
ENVS = ["CartPole-v1", "busy-200us", "image-84x84x4"]
N_ENVS = [64, 256, 1024]
BACKENDS = ["DummyVecEnv", "SubprocVecEnv", "AsyncVectorEnv", "ShmVecEnv", "EnvPool"]
#: Backends given a number of workers (processes, or EnvPool's threads): swept over worker_counts().
SWEPT = ("ShmVecEnv", "ShmVectorEnv", "ShmEnvPool", "EnvPool")
#: Backends that start one process per env: capped at max_processes.
ONE_PER_ENV = ("SubprocVecEnv", "AsyncVectorEnv")


@dataclass
class ScalingConfig:
    envs: list[str] = field(default_factory=lambda: list(ENVS))
    n_envs: list[int] = field(default_factory=lambda: list(N_ENVS))
    backends: list[str] = field(default_factory=lambda: list(BACKENDS))
    workers: int = field(default_factory=cores)  # the top of the sweep
    max_processes: int | None = None  # one-process-per-env backends; None: 2 x workers
    seconds: float = 2.0
    rounds: int = 10
    start_method: str = "fork"

    @property
    def process_cap(self) -> int:
        return self.max_processes or 2 * self.workers


def worker_counts(top: int) -> list[int]:
    """1, 2, 4, ... below ``top``, then ``top``: ``[1, 2, 4, 8, 12]`` for 12."""
    counts, w = [], 1
    while w < top:
        counts.append(w)
        w *= 2
    return counts + [max(1, top)]


def warmup_steps(n_envs: int) -> int:
    """Vec steps before timing: 20 for small batches, fewer for large ones (a DummyVecEnv step
    of 1,024 busy-200us envs takes 0.2 s)."""
    return max(2, min(20, 4096 // n_envs))


def config_from_args(args: argparse.Namespace, preset: dict[str, Any]) -> ScalingConfig:
    """The scaling run asked for on the command line (``bench._parser``'s options); raises ValueError."""
    envs = args.envs or preset["envs"]
    for env in envs:
        check_env_name(env)
    backends = args.backends or list(BACKENDS)
    for name in backends:
        if B.get(name).remote:
            raise ValueError(f"{name} runs in another interpreter: the scaling preset does not run it")
    n_envs = sorted(set(args.n_envs or preset["n_envs"]))
    if args.max_envs is not None:
        if args.max_envs < 1:
            raise ValueError(f"--max-envs must be at least 1, got {args.max_envs}")
        n_envs = [n for n in n_envs if n <= args.max_envs] or [args.max_envs]
    if args.max_processes is not None and args.max_processes < 1:
        raise ValueError(f"--max-processes must be at least 1, got {args.max_processes}")
    return ScalingConfig(
        envs=envs, n_envs=n_envs, backends=backends, workers=args.workers or cores(),
        max_processes=args.max_processes, seconds=args.seconds if args.seconds is not None else preset["seconds"],
        rounds=args.rounds, start_method=args.start_method,
    )


def _plan(name: str, n_envs: int, config: ScalingConfig) -> list[tuple[str, int, int]]:
    """(label, envs stepped, workers) of each configuration of backend ``name`` at ``n_envs``."""
    if name in SWEPT:
        return [(f"{name} w={w}", n_envs, w) for w in worker_counts(config.workers) if w <= n_envs]
    if name in ONE_PER_ENV:
        m = min(n_envs, config.process_cap)
        return [(name, m, m)]
    return [(name, n_envs, 1)]


def run(config: ScalingConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Runs the sweep; returns the results (what ``--json`` writes, ``kind: "scaling"``)."""
    names, skipped = [], []
    for name in config.backends:
        reason = B.get(name).missing()
        if reason:
            skipped.append({"backend": name, "reason": reason})
        else:
            names.append(name)
    limit_cores = min(config.workers, cores())
    total = len(config.envs) * (1 + len(config.n_envs) * config.rounds)
    progress = progress or Progress(total, enabled=False)
    progress.total = max(total, 1)
    results: dict[str, Any] = {
        "version": RESULTS_VERSION, "kind": KIND, "machine": machine(), "config": asdict(config),
        "worker_counts": worker_counts(config.workers), "process_cap": config.process_cap,
        "limit_cores": limit_cores, "bare": {}, "points": [], "skipped": skipped,
    }
    for env in config.envs:
        progress.show(f"{env}: one env in a bare loop")
        results["bare"][env] = bare_loop_sps(env, min(config.seconds, 2.0))
        progress.advance()
        runnable = []
        for name in names:
            if B.get(name).supports(env):
                runnable.append(name)
            else:
                skipped.append({"backend": name, "env": env,
                                "reason": f"runs only its own envs ({', '.join(B.get(name).envs or ())})"})
        for n_envs in config.n_envs:
            _measure_group(env, n_envs, runnable, config, results, progress)
    progress.finish()
    return results


def limit(results: dict[str, Any], env: str, workers: int) -> float:
    """The limit at ``workers``: min(workers, cores) x one env's bare-loop steps/s."""
    return min(workers, results["limit_cores"]) * results["bare"][env]


def _measure_group(env: str, n_envs: int, runnable: list[str], config: ScalingConfig, results: dict[str, Any],
                   progress: Progress) -> None:
    """Every configuration at one (env, n_envs), side by side in alternating rounds."""
    skipped = results["skipped"]
    plan = [(name, *p) for name in runnable for p in _plan(name, n_envs, config)]
    opened: dict[str, LocalBackend] = {}
    meta: dict[str, tuple[str, int, int]] = {}
    for i, (name, label, m, w) in enumerate(plan):
        progress.show(f"{env} x {n_envs}: building {label} ({i + 1}/{len(plan)})")
        try:
            opened[label] = LocalBackend(name, B.BuildSpec(env, m, w, config.start_method), warmup_steps(m))
            meta[label] = (name, m, w)
        except Exception as e:  # noqa: BLE001 - a backend that fails to build is reported, the run goes on
            skipped.append({"backend": label, "env": env, "n_envs": n_envs,
                            "reason": f"failed to build or step: {describe_error(e)}"})
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        progress.advance(f"{env} x {n_envs}: measuring {len(opened)} configurations, round {done}/{config.rounds}")

    def failed(label: str, e: Exception) -> None:
        skipped.append({"backend": label, "env": env, "n_envs": n_envs,
                        "reason": f"failed while stepping: {describe_error(e)}"})

    try:
        per_round = side_by_side(opened, config.seconds, config.rounds, tick, on_error=failed)
    finally:
        for o in opened.values():
            o.close()
    progress.done += config.rounds - done
    ref = per_round.get(REFERENCE)
    for label, figures in per_round.items():
        name, m, w = meta[label]
        one = per_round.get(f"{name} w=1")
        sps = float(np.median(figures))
        results["points"].append({
            "env": env, "n_envs": n_envs, "backend": name, "label": label, "workers": w, "envs_stepped": m,
            "capped": m < n_envs, "steps_per_s": sps, "rounds": figures,
            "ratio_to_dummy": median_ratio(figures, ref) if ref else None,
            "share_of_limit": sps / limit(results, env, w),
            "ratio_to_one_worker": median_ratio(figures, one) if one and name in SWEPT else None,
        })


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _ratio(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def header(results: dict[str, Any]) -> str:
    """Where and how the run was measured, and the cap of the one-process-per-env backends."""
    m, c = results["machine"], results["config"]
    budget = m.get("cpu_budget") or {}
    found = ""
    if budget:
        physical = "?" if budget.get("physical") is None else budget["physical"]
        quota = "none" if budget.get("quota") is None else f"{budget['quota']:g}"
        found = f" (CPUs {budget['affinity']}, physical cores {physical}, cgroup quota {quota})"
    text = (f"Scaling: {m['cores']} cores{found}, {m['cpu']}, Python {m['python']}; workers "
            f"{', '.join(map(str, results['worker_counts']))}; {c['seconds']:g} s per configuration in "
            f"{c['rounds']} alternating rounds, start method {c['start_method']}.")
    capped = [b for b in ONE_PER_ENV if b in c["backends"]]
    if capped:
        cap = results["process_cap"]
        text += (f"\n{' and '.join(capped)} run one process per env: capped at {cap} processes (2 x cores unless "
                 f"--max-processes), so past that they step {cap} envs, not n_envs (the envs column marks them).")
    return text


def format_table(results: dict[str, Any]) -> str:
    lines = [header(results)]
    for env, bare in results["bare"].items():
        lines.append(f"\n{env}: one env in a bare loop {bare:,.0f} steps/s; limit at w workers = "
                     f"min(w, {results['limit_cores']}) x that")
        lines.append(f"{'n_envs':>7}  {'backend':<16}{'workers':>8}{'envs':>7}{'steps/s':>13}{'x Dummy':>9}"
                     f"{'of limit':>10}{'x 1 worker':>12}")
        for p in (p for p in results["points"] if p["env"] == env):
            envs = f"{p['envs_stepped']}{'*' if p['capped'] else ''}"
            lines.append(f"{p['n_envs']:>7}  {p['backend']:<16}{p['workers']:>8}{envs:>7}{p['steps_per_s']:>13,.0f}"
                         f"{_ratio(p['ratio_to_dummy']):>9}{100 * p['share_of_limit']:>9.0f}%"
                         f"{_ratio(p['ratio_to_one_worker']):>12}")
    if results["skipped"]:
        lines.append("\nSkipped:")
        for s in dict.fromkeys(
                f"  {s['backend']}{' (' + s['env'] + ')' if 'env' in s else ''}: {s['reason']}"
                for s in results["skipped"]):
            lines.append(s)
    lines.append("\nRatios hold across machines; absolute steps/s do not. Compare backends within one run.")
    return "\n".join(lines)


def format_markdown(results: dict[str, Any]) -> str:
    out = [header(results), "",
           "| env | n_envs | backend | workers | envs stepped | steps/s | x DummyVecEnv | of limit | x 1 worker |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for p in results["points"]:
        envs = f"{p['envs_stepped']}{' (capped)' if p['capped'] else ''}"
        cell = f"{p['steps_per_s']:,.0f}"
        out.append(f"| {p['env']} | {p['n_envs']} | {p['backend']} | {p['workers']} | {envs} | "
                   f"{'**' + cell + '**' if p['backend'].startswith('Shm') else cell} | "
                   f"{_ratio(p['ratio_to_dummy'])} | {100 * p['share_of_limit']:.0f}% | "
                   f"{_ratio(p['ratio_to_one_worker'])} |")
    return "\n".join(out)
