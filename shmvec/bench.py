"""``python -m shmvec.bench`` (or ``shmvec-bench``): shmvec side by side with the vec envs you use today.

Every backend steps the same envs (built by one factory) with random actions drawn beforehand,
in one run, in alternating short rounds so that a slow spell of a shared machine hits all of them
alike; the table reports each backend's steps/s, its ratio to ``DummyVecEnv`` (median of the
per-round ratios), its share of the limit (the cores used x the steps/s of one env stepped in a
bare loop, measured in the same run) and its share of the ceiling: as many bare loops as the
limit counts cores, run at the same time in processes of their own and measured in the same
rounds as the backends, i.e. what that many busy processes really get from the machine at that
moment (on a shared VM it can be well below the limit).  Ratios hold across machines; absolute
numbers do not.

Also measured: start-up (construct + first reset) and memory (PSS of all processes) in a fresh
interpreter per backend, and the round-trip latency of one step with one env of zero cost.
A backend that is not installed is skipped with a note.

``--preset multiagent`` runs PettingZoo envs (MPE's simple_spread, butterfly's pistonball) through
``ShmMultiAgentVecEnv`` beside SuperSuit's own vec env for SB3, multiprocess (``num_cpus`` =
workers) and in process (``num_cpus=0``, the reference there); steps/s count agent steps (rows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shmvec._bench import backends as B
from shmvec._bench import scaling
from shmvec._bench import training as T
from shmvec._bench.envs import check_env_name, env_missing, env_names, is_multiagent
from shmvec._bench.measures import Ceiling, bare_loop_sps, cores, median_ratio, side_by_side, summarize_latency
from shmvec._bench.remote import RemoteBackend, RemoteError, footprint
from shmvec._bench.session import LocalBackend, Progress, describe_error, machine

RESULTS_VERSION = 1
REFERENCE = "DummyVecEnv"  # of the single-agent envs (B.reference(env) says which, per env)
OURS = "ShmVecEnv"
CEILING = "bare loops at once"  # the ceiling stepper's name in the rounds (never a backend name)

#: ``--preset``: named sets of defaults; options given on the command line win.
PRESETS: dict[str, dict[str, Any]] = {
    # About two minutes on 2 cores: the README's main command.
    "quick": {"envs": ["CartPole-v1"], "n_envs": [8, 64], "seconds": 2.0, "footprint_at": None,
              "training_points": ["CartPole-v1:8", "CartPole-v1:64"]},
    # Every env at 1..64 envs, and where users train at 8 and 64 (about 17 minutes on 2 cores): the README's figures.
    "full": {
        "envs": ["CartPole-v1", "busy-200us", "image-84x84x4", "image-210x160x3", "CartPole-info", "dict-obs"],
        "n_envs": [1, 4, 8, 16, 64], "seconds": 2.0,
        "footprint_at": ["CartPole-v1:64", "image-84x84x4:64"],
        "training_points": ["CartPole-v1:8", "CartPole-v1:64", "image-84x84x4:8", "image-84x84x4:64"],
    },
    # The three comparisons issue 6 sets goals for, 5 s each (about 2 minutes on 2 cores).
    "targets": {
        "envs": ["CartPole-v1", "image-84x84x4", "busy-200us"], "n_envs": [64], "seconds": 5.0,
        "points": ["CartPole-v1:64", "image-84x84x4:64", "busy-200us:16"], "footprint_at": None,
    },
    # PettingZoo envs: ShmMultiAgentVecEnv against SuperSuit's vec env, multiprocess and in process
    # (about a minute on 2 cores); agent steps/s.
    "multiagent": {
        "envs": ["pz-simple_spread", "pz-pistonball"], "n_envs": [4, 16], "seconds": 2.0, "footprint_at": None,
        "points": ["pz-simple_spread:4", "pz-simple_spread:16", "pz-pistonball:4"],
        "backends": B.backend_names(multiagent=True), "footprint": False, "latency": False,
    },
    # Steps/s against workers, 1 to the cores, at 64 to 1,024 envs (shmvec._bench.scaling): its own run.
    "scaling": {"envs": scaling.ENVS, "n_envs": scaling.N_ENVS, "seconds": 2.0, "footprint_at": None},
}


@dataclass
class Config:
    envs: list[str] = field(default_factory=lambda: ["CartPole-v1"])
    n_envs: list[int] = field(default_factory=lambda: [8, 64])
    backends: list[str] = field(default_factory=B.backend_names)
    workers: int = field(default_factory=cores)
    seconds: float = 2.0
    rounds: int = 10
    start_method: str = "fork"
    puffer_python: str | None = None
    points: list[str] | None = None  # ["ENV:N", ...] instead of every env at every n_envs
    footprint_at: list[str] | None = None  # ["ENV:N", ...]; None: the first env at the largest n_envs
    footprint: bool = True
    latency: bool = True
    latency_steps: int = 200
    # Where users train (shmvec._bench.training): situations measured at training_points ("ENV:N").
    situations: list[str] = field(default_factory=lambda: list(T.SITUATIONS))
    workers_given: bool = False  # --workers: the training situations then pass it to shmvec too
    situations_given: bool = False  # --situations on the command line
    training_points: list[str] | None = None


def check_puffer_python(python: str | None) -> str | None:
    """Why PufferLib cannot run (no interpreter given, or pufferlib not importable in it), or None."""
    if not python:
        return "needs its own interpreter (numpy<2, gymnasium<=0.29): pass --puffer-python /path/to/venv/bin/python"
    try:
        out = subprocess.run([python, "-c", "import pufferlib.vector, psutil"], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"--puffer-python {python} does not run: {e}"
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"--puffer-python {python} cannot import pufferlib.vector and psutil: {last}"
    return None


def available_backends(config: Config) -> tuple[list[str], list[dict[str, str]]]:
    """The requested backends that can run here, and a note for each that cannot."""
    ok, skipped = [], []
    for name in config.backends:
        backend = B.get(name)
        reason = check_puffer_python(config.puffer_python) if backend.remote else backend.missing()
        if reason:
            skipped.append({"backend": name, "reason": reason})
        else:
            ok.append(name)
    return ok, skipped


def _open(name: str, spec: B.BuildSpec, config: Config) -> Any:
    if B.get(name).remote:
        assert config.puffer_python
        return RemoteBackend(config.puffer_python, name, spec)
    return LocalBackend(name, spec)


def _open_all(names: list[str], spec: B.BuildSpec, config: Config,
              skipped: list[dict[str, Any]]) -> dict[str, Any]:
    opened: dict[str, Any] = {}
    for name in names:
        try:
            opened[name] = _open(name, spec, config)
        except Exception as e:  # noqa: BLE001 - a backend that fails to build is reported, the run goes on
            skipped.append({"backend": name, "env": spec.env, "n_envs": spec.n_envs,
                            "reason": f"failed to build or step: {describe_error(e)}"})
    return opened


def parse_points(items: list[str]) -> list[tuple[str, int]]:
    """``["ENV:N", ...]`` as (env, n_envs) pairs; raises ValueError on a bad one."""
    out = []
    for item in items:
        env, _, n = item.rpartition(":")
        if not env or not n.isdigit() or int(n) < 1:
            raise ValueError(f"{item!r} is not ENV:N (for example CartPole-v1:64)")
        out.append((check_env_name(env), int(n)))
    return out


def _points(config: Config) -> list[tuple[str, int]]:
    if config.points:
        return parse_points(config.points)
    return [(env, n) for env in config.envs for n in config.n_envs]


def _footprint_points(config: Config) -> list[tuple[str, int]]:
    if config.footprint_at is None:
        first = _points(config)[0][0]
        return [(first, max(n for env, n in _points(config) if env == first))]
    return parse_points(config.footprint_at)


def run(config: Config, progress: Progress | None = None) -> dict[str, Any]:
    """Runs the whole benchmark; returns the results (the structure ``--json`` writes)."""
    for env in config.envs:
        check_env_name(env)
    names, skipped = available_backends(config)
    points = _points(config)
    envs = list(dict.fromkeys(env for env, _ in points))
    foot = _footprint_points(config) if config.footprint else []
    train = parse_points(config.training_points or []) if config.situations else []
    total = (len(envs) + len(points) * config.rounds + len(foot) * len(names) + (len(names) if config.latency else 0)
             + len(train) * config.rounds * (1 + ("busy" in config.situations) + ("later" in config.situations)))
    progress = progress or Progress(total, enabled=False)
    progress.total = max(total, 1)
    results: dict[str, Any] = {
        "version": RESULTS_VERSION, "machine": machine(), "config": asdict(config),
        "limit_cores": min(config.workers, cores()),
        "bare": {}, "limit": {}, "ceiling": [], "points": [], "shmvec_vs": {}, "pairs": [], "footprint": [],
        "latency": [], "training": [],
        "skipped": skipped,
    }
    load = T.machine_load().before()
    results["reference"] = {env: B.reference(env) for env in envs}
    results["ours"] = {env: B.ours(env) for env in envs}
    for env in envs:
        missing = env_missing(env)
        if missing:
            skipped.append({"env": env, "reason": f"env not built: {missing}"})
            progress.done += 1 + config.rounds * sum(e == env for e, _ in points)
            continue
        progress.show(f"{env}: one env in a bare loop")
        results["bare"][env] = bare_loop_sps(env, config.seconds)
        results["limit"][env] = results["limit_cores"] * results["bare"][env]
        progress.advance()
        runnable = []
        for name in names:
            reason = B.get(name).unsupported(env)
            if reason is None:
                runnable.append(name)
            else:
                skipped.append({"backend": name, "env": env, "reason": reason})
        for n_envs in (n for e, n in points if e == env):
            _measure_point(env, n_envs, runnable, config, results, progress)
    for env, n_envs in foot:
        for name in names:
            progress.show(f"start-up and memory: {name}, {env} x {n_envs}")
            if B.get(name).supports(env):
                _footprint(name, env, n_envs, config, results)
            progress.advance()
    if config.latency:
        _latency(config, names, results, progress)
    for env, n_envs in train:
        _measure_training(env, n_envs, names, config, results, progress)
    results["load"] = load.after().as_dict()
    progress.finish()
    return results


def _measure_training(env: str, n_envs: int, names: list[str], config: Config, results: dict[str, Any],
                      progress: Progress) -> None:
    """shmvec and the in-process vec env of the same API, in each situation (shmvec._bench.training)."""
    pairs = [n for pair in T.PAIRS.items() for n in pair if n in names and B.get(n).supports(env)]
    if not pairs and not config.situations_given:
        return  # --backends left them out
    if env_missing(env) or not pairs:
        results["skipped"].append({"env": env, "n_envs": n_envs, "reason": "where users train: "
                                   + (f"env not built: {env_missing(env)}" if env_missing(env) else
                                      "none of " + ", ".join(n for pair in T.PAIRS.items() for n in pair) + " runs")})
        return
    progress.show(f"{env} x {n_envs}: where users train ({', '.join(config.situations)})")
    spec = B.BuildSpec(env, n_envs, config.workers, config.start_method, shm_defaults=not config.workers_given)
    results["training"] += T.measure_point(env, n_envs, pairs, spec,
                                           config.situations, config.seconds, config.rounds, results["skipped"],
                                           tick=lambda: progress.advance(f"{env} x {n_envs}: where users train"))


def _measure_point(env: str, n_envs: int, runnable: list[str], config: Config, results: dict[str, Any],
                   progress: Progress) -> None:
    """Steps/s of every backend at one point, side by side; ratios are medians of per-round ratios."""
    skipped = results["skipped"]
    spec = B.BuildSpec(env, n_envs, config.workers, config.start_method)
    progress.show(f"{env} x {n_envs}: building {len(runnable)} backends")
    opened = _open_all(runnable, spec, config, skipped)
    k = results["limit_cores"]
    try:
        opened[CEILING] = Ceiling(env, k, config.start_method)
    except Exception as e:  # noqa: BLE001 - the run goes on without the ceiling column
        skipped.append({"backend": CEILING, "env": env, "n_envs": n_envs, "reason": f"failed to start: {describe_error(e)}"})
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        progress.advance(f"{env} x {n_envs}: measuring, round {done}/{config.rounds}")

    def failed(name: str, e: Exception) -> None:
        skipped.append({"backend": name, "env": env, "n_envs": n_envs, "reason": f"failed while stepping: {describe_error(e)}"})

    try:
        per_round = side_by_side(opened, config.seconds, config.rounds, tick, on_error=failed)
    finally:
        workers = {name: o.workers for name, o in opened.items()}
        for o in opened.values():
            o.close()
    progress.done += config.rounds - done
    ref = per_round.get(B.reference(env))
    ceiling = per_round.pop(CEILING, None)
    if ceiling:
        results["ceiling"].append({"env": env, "n_envs": n_envs, "processes": k,
                                   "steps_per_s": float(np.median(ceiling)), "rounds": ceiling})
    for name, figures in per_round.items():
        sps = float(np.median(figures))
        results["points"].append({
            "env": env, "backend": name, "n_envs": n_envs, "workers": workers[name], "steps_per_s": sps,
            "rounds": figures, "ratio_to_dummy": median_ratio(figures, ref) if ref else None,
            "share_of_limit": sps / results["limit"][env],
            "share_of_ceiling": median_ratio(figures, ceiling) if ceiling else None,
        })
    for name, figures in per_round.items():
        versus = B.get(name).versus
        if versus in per_round:  # shmvec through a library's API against that library's own parallel env
            results.setdefault("pairs", []).append({"env": env, "n_envs": n_envs, "backend": name, "versus": versus,
                                                    "ratio": median_ratio(figures, per_round[versus])})
    ours = B.ours(env)
    if ours in per_round:
        results["shmvec_vs"].setdefault(env, {})[str(n_envs)] = {
            name: median_ratio(per_round[ours], figures) for name, figures in per_round.items() if name != ours
        }


def _footprint(name: str, env: str, n_envs: int, config: Config, results: dict[str, Any]) -> None:
    python = config.puffer_python if B.get(name).remote else sys.executable
    assert python
    try:
        fp = footprint(python, name, B.BuildSpec(env, n_envs, config.workers, config.start_method))
    except (RemoteError, OSError) as e:
        results["skipped"].append({"backend": name, "env": env, "n_envs": n_envs,
                                   "reason": f"start-up/memory helper failed: {describe_error(e)}"})
        return
    fp.pop("pid", None)
    results["footprint"].append({"backend": name, "env": env, "n_envs": n_envs, **fp})


def _latency(config: Config, names: list[str], results: dict[str, Any], progress: Progress) -> None:
    """Round-trip time of one vec step with one env of zero cost, backends in alternating rounds."""
    spec = B.BuildSpec("zero-cost", 1, 1, config.start_method)
    runnable = [n for n in names if B.get(n).supports("zero-cost")]
    progress.show("latency: building")
    opened = _open_all(runnable, spec, config, results["skipped"])
    samples: dict[str, list[float]] = {name: [] for name in opened}
    try:
        per_round = max(1, config.latency_steps // 5)
        for _ in range(5):
            for name, o in opened.items():
                if name not in samples:
                    continue
                try:
                    samples[name] += o.latency_us(per_round)
                except Exception as e:  # noqa: BLE001 - reported, the others go on
                    results["skipped"].append({"backend": name, "env": "zero-cost",
                                               "reason": f"failed while stepping: {describe_error(e)}"})
                    del samples[name]
    finally:
        for o in opened.values():
            o.close()
    for name in names:
        if name in samples and samples[name]:
            results["latency"].append({"backend": name, **summarize_latency(samples[name])})
        progress.advance(f"latency: {name}")


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _ratio(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def _reference(results: dict[str, Any], env: str) -> str:
    return results.get("reference", {}).get(env, REFERENCE)  # results saved before the multi-agent envs: none


def _ours(results: dict[str, Any], env: str) -> str:
    return results.get("ours", {}).get(env, OURS)


def format_table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    limit_cores = results["limit_cores"]
    for env, bare in results["bare"].items():
        limit = results["limit"][env]
        ref = _reference(results, env)
        unit = "steps/s" if ref == REFERENCE else "agent-steps/s"
        lines.append(f"\n{env}: one env in a bare loop {bare:,.0f} {unit}; limit ({limit_cores} cores) "
                     f"{limit:,.0f} {unit}")
        if ref != REFERENCE:
            lines.append(f"(steps/s count agent steps, one per row; x ref: ratio to {ref})")
        lines.append(f"{'backend':<20}{'n_envs':>7}{'workers':>8}{'steps/s':>13}"
                     f"{'x Dummy' if ref == REFERENCE else 'x ref':>9}{'of limit':>10}{'of ceiling':>12}")
        points = [p for p in results["points"] if p["env"] == env]
        ceilings = {c["n_envs"]: c for c in results.get("ceiling", []) if c["env"] == env}
        for n_envs in sorted({p["n_envs"] for p in points}):
            c = ceilings.get(n_envs)
            if c is not None:
                lines.append(f"{'(' + str(c['processes']) + ' bare loops)':<20}{n_envs:>7}{c['processes']:>8}"
                             f"{c['steps_per_s']:>13,.0f}{'':>9}{100 * c['steps_per_s'] / limit:>9.0f}%{'100%':>12}")
            for p in (p for p in points if p["n_envs"] == n_envs):
                workers = "-" if p["workers"] is None else str(p["workers"])
                share = p.get("share_of_ceiling")
                lines.append(f"{p['backend']:<20}{n_envs:>7}{workers:>8}{p['steps_per_s']:>13,.0f}"
                             f"{_ratio(p['ratio_to_dummy']):>9}{100 * p['share_of_limit']:>9.0f}%"
                             f"{'-' if share is None else f'{100 * share:.0f}%':>12}")
        for n_envs, ratios in results["shmvec_vs"].get(env, {}).items():
            said = ", ".join(f"{_ratio(r)}x {name}" for name, r in ratios.items())
            lines.append(f"  at {n_envs} envs {_ours(results, env)} runs {said}")
        for q in (q for q in results.get("pairs", []) if q["env"] == env):
            lines.append(f"  at {q['n_envs']} envs {q['backend']} runs {_ratio(q['ratio'])}x {q['versus']}")
    if results["footprint"]:
        kind = results["footprint"][0]["memory_kind"].upper()
        lines.append(f"\nStart-up (construct + first reset) and memory ({kind} of all processes), fresh interpreter each")
        lines.append(f"{'backend':<16}{'env':<18}{'n_envs':>7}{'start s':>9}{'MiB added':>11}{'MiB total':>11}"
                     f"{'procs':>7}")
        for r in results["footprint"]:
            lines.append(f"{r['backend']:<16}{r['env']:<18}{r['n_envs']:>7}{r['startup_s']:>9.2f}"
                         f"{r['memory_added_bytes'] / 2**20:>11.0f}{r['memory_bytes'] / 2**20:>11.0f}"
                         f"{r['processes']:>7}")
    if results["latency"]:
        lines.append("\nRound-trip latency of one step, one env of zero cost")
        lines.append(f"{'backend':<16}{'median us':>10}{'p90 us':>10}")
        for r in results["latency"]:
            lines.append(f"{r['backend']:<16}{r['median_us']:>10.1f}{r['p90_us']:>10.1f}")
    lines += T.format_text(results.get("training", []), _ratio)
    if results["skipped"]:
        lines.append("\nSkipped:")
        seen = set()
        for s in results["skipped"]:
            where = " ".join(str(s[k]) for k in ("env", "n_envs") if k in s)
            line = f"  {s.get('backend', '')}{' (' + where + ')' if where else ''}: {s['reason']}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
    lines.append("\nRatios hold across machines; absolute steps/s do not. Compare backends within one run.")
    for warning in results.get("load", {}).get("warnings", []):
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def _k(x: float) -> str:
    return f"{x / 1e3:,.0f}k" if x >= 1e4 else (f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}")


def format_markdown(results: dict[str, Any]) -> str:
    """The results as markdown tables (the README's): steps/s and ratio to DummyVecEnv per backend
    (columns) and env and n_envs (rows); shmvec against each peer; start-up, memory, latency."""
    m = results["machine"]
    c = results["config"]
    out = [f"{m['cores']} cores ({m['cpu']}), Python {m['python']}, "
           + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
           + f"; {c['seconds']:g} s per backend and point in {c['rounds']} alternating rounds, "
           f"{c['workers']} workers, start method {c['start_method']}.", ""]
    backends = list(dict.fromkeys(p["backend"] for p in results["points"]))
    ceilings = {(c["env"], c["n_envs"]): c["steps_per_s"] for c in results.get("ceiling", [])}
    # A run without the ceiling (an older results file, or none measured) has no such column.
    refs = list(dict.fromkeys(_reference(results, env) for env in results["bare"]))
    out.append(f"Env steps/s (x {' or '.join(refs)}, median of per-round ratios"
               + ("; agent steps/s, one per row, for the multi-agent envs" if refs != [REFERENCE] else "")
               + f"); limit = {results['limit_cores']} cores x one env in a bare loop"
               + (f"; ceiling = {results['limit_cores']} bare loops at once, in the same rounds." if ceilings else "."))
    out.append("")
    out.append("| env | n_envs | " + " | ".join(backends) + " | limit |" + (" ceiling |" if ceilings else ""))
    out.append("|---|---:|" + "---:|" * (len(backends) + 1 + bool(ceilings)))
    for env in results["bare"]:
        for n in sorted({p["n_envs"] for p in results["points"] if p["env"] == env}):
            cells = []
            for b in backends:
                p = next((p for p in results["points"] if (p["env"], p["n_envs"], p["backend"]) == (env, n, b)), None)
                if p is None:
                    cells.append("-")
                else:
                    cell = f"{_k(p['steps_per_s'])} ({_ratio(p['ratio_to_dummy'])})"
                    cells.append(f"**{cell}**" if b == _ours(results, env) else cell)
            ceiling = ceilings.get((env, n))
            out.append(f"| {env} | {n} | " + " | ".join(cells) + f" | {_k(results['limit'][env])} |"
                       + ((" - |" if ceiling is None else f" {_k(ceiling)} |") if ceilings else ""))
    for ours in dict.fromkeys(_ours(results, env) for env in results["shmvec_vs"]):
        by_env = {env: by_n for env, by_n in results["shmvec_vs"].items() if _ours(results, env) == ours}
        peers = list(dict.fromkeys(b for by_n in by_env.values() for ratios in by_n.values() for b in ratios))
        out += ["", f"{ours} against each peer (median of per-round ratios; above 1: {ours} is faster):", "",
                "| env | n_envs | " + " | ".join(peers) + " |", "|---|---:|" + "---:|" * len(peers)]
        for env, by_n in by_env.items():
            for n, ratios in by_n.items():
                out.append(f"| {env} | {n} | " + " | ".join(_ratio(ratios.get(b)) for b in peers) + " |")
    if results.get("pairs"):
        out += ["", "shmvec through each library's API against the library's own parallel env (median of per-round "
                    "ratios; above 1: shmvec is faster):", "", "| env | n_envs | shmvec | against | ratio |",
                "|---|---:|---|---|---:|"]
        for q in results["pairs"]:
            out.append(f"| {q['env']} | {q['n_envs']} | {q['backend']} | {q['versus']} | {_ratio(q['ratio'])} |")
    out += T.format_markdown(results.get("training", []), _ratio)
    if results["footprint"]:
        kind = results["footprint"][0]["memory_kind"].upper()
        out += ["", f"Start-up (construct + first reset) and memory ({kind} of all processes; added = after - before "
                    "building), each in a fresh interpreter:", "",
                "| backend | env | n_envs | start-up s | MiB added | MiB total | processes |",
                "|---|---|---:|---:|---:|---:|---:|"]
        for r in results["footprint"]:
            out.append(f"| {r['backend']} | {r['env']} | {r['n_envs']} | {r['startup_s']:.2f} | "
                       f"{r['memory_added_bytes'] / 2**20:.0f} | {r['memory_bytes'] / 2**20:.0f} | {r['processes']} |")
    if results["latency"]:
        out += ["", "Round-trip latency of one step, one env of zero cost (microseconds):", "",
                "| backend | median | p90 |", "|---|---:|---:|"]
        for r in results["latency"]:
            out.append(f"| {r['backend']} | {r['median_us']:.1f} | {r['p90_us']:.1f} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shmvec.bench", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=f"envs: {', '.join(env_names())} (busy-<N>us and image-<H>x<W>x<C> take any size). "
               f"Backends: {', '.join(B.backend_names())}; only when named: "
               f"{', '.join(n for n in B.backend_names(all_=True) if not B.get(n).by_default)}.",
    )
    p.add_argument("--preset", choices=list(PRESETS), default="quick",
                   help="a named set of defaults (quick: about two minutes on 2 cores; full: every env, "
                        "n_envs 1..64, the README's figures; targets: CartPole at 64 envs, 84x84x4 images at 64, a 200 us env at 16, 5 s each; "
                        "scaling: steps/s against workers from 1 to the cores, at 64 to 1,024 envs; "
                        "multiagent: PettingZoo envs, ShmMultiAgentVecEnv against SuperSuit, agent steps/s); "
                        "options below override it")
    p.add_argument("--envs", nargs="+", metavar="ENV", help="envs to run (default: CartPole-v1)")
    p.add_argument("--n-envs", nargs="+", type=int, metavar="N", help="numbers of envs (default: 8 64)")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help="backends (default: all installed but the other RL libraries' pairs, which run when named)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (threads for EnvPool) of the backends that take a number "
                        "(default: the cores this process may use)")
    p.add_argument("--seconds", type=float, help="seconds measured per backend and point (default 2)")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds the seconds are split into")
    p.add_argument("--start-method", default="fork", choices=["fork", "forkserver", "spawn"],
                   help="start method of the multiprocess backends (default fork; it changes start-up, "
                        "not stepping speed)")
    p.add_argument("--puffer-python", metavar="PYTHON",
                   help="interpreter of a venv with PufferLib (numpy<2, gymnasium<=0.29); PufferLib is "
                        "skipped without it")
    p.add_argument("--points", nargs="+", metavar="ENV:N",
                   help="measure these (env, n_envs) pairs instead of every env at every n_envs")
    p.add_argument("--footprint-at", nargs="+", metavar="ENV:N",
                   help="where to measure start-up and memory (default: the first env at the largest n_envs)")
    p.add_argument("--no-footprint", action="store_true", help="skip start-up and memory")
    p.add_argument("--no-latency", action="store_true", help="skip the round-trip latency")
    p.add_argument("--max-envs", type=int, metavar="N",
                   help="scaling: leave out the n_envs above N (a short run on a small machine)")
    p.add_argument("--max-processes", type=int, metavar="N",
                   help="scaling: processes of the one-process-per-env backends (SubprocVecEnv, AsyncVectorEnv) at "
                        "most; past it they step N envs (default: 2 x the cores)")
    p.add_argument("--situations", nargs="*", choices=list(T.SITUATIONS), metavar="SITUATION",
                   help="where users train, measured at --training-points for ShmVecEnv x DummyVecEnv and ShmVectorEnv "
                        "x SyncVectorEnv: random (random actions), policy (a policy picks the actions, torch at its "
                        "default threads), busy (another process keeps a core busy), later (the same process, started "
                        "after the vec envs); default all four, none to skip")
    p.add_argument("--training-points", nargs="+", metavar="ENV:N",
                   help="where to measure the situations (default: the preset's, quick: CartPole-v1 at 8 and 64; "
                        "with --envs, --n-envs or --points: the run's own, when --situations is given)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--plot", metavar="DIR", help="also write throughput.png and footprint.png into DIR "
                                                 "(needs shmvec[plot])")
    p.add_argument("--from-json", metavar="PATH", help="do not measure: print (and plot) the results saved in PATH")
    p.add_argument("--markdown", action="store_true", help="print the results as markdown tables (the README's)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--list", action="store_true", help="list backends (installed or not) and envs, then exit")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    preset = PRESETS[args.preset]
    envs = args.envs or preset["envs"]
    for env in envs:
        check_env_name(env)
    # By default the backends that run the envs asked for: single-agent, multi-agent or both.
    backends = args.backends or preset.get("backends") or [
        *B.backend_names(), *(B.backend_names(multiagent=True) if any(map(is_multiagent, envs)) else [])]
    for name in backends:
        B.get(name)
    # --envs or --n-envs on the command line replace the preset's pairs.
    points = args.points or (None if (args.envs or args.n_envs) else preset.get("points"))
    if points:
        parse_points(points)
    if args.footprint_at:
        parse_points(args.footprint_at)
    # Where users train: the preset's points; a run of its own envs or points measures them there
    # only when --situations asks for it.
    training_points = args.training_points
    if training_points is None and not (args.envs or args.n_envs or args.points):
        training_points = preset.get("training_points")
    elif training_points is None and args.situations:
        own = parse_points(points) if points else [(e, n) for e in envs for n in (args.n_envs or preset["n_envs"])]
        training_points = [f"{e}:{n}" for e, n in own if not is_multiagent(e)]
    parse_points(training_points or [])
    return Config(
        envs=envs, n_envs=args.n_envs or preset["n_envs"], backends=backends, points=points,
        workers=args.workers or cores(), seconds=args.seconds if args.seconds is not None else preset["seconds"],
        rounds=args.rounds, start_method=args.start_method, puffer_python=args.puffer_python,
        footprint_at=args.footprint_at or preset["footprint_at"],
        footprint=not args.no_footprint and (preset.get("footprint", True) or bool(args.footprint_at)),
        latency=not args.no_latency and preset.get("latency", True),
        situations=list(T.SITUATIONS) if args.situations is None else args.situations,
        workers_given=args.workers is not None, situations_given=args.situations is not None,
        training_points=training_points,
    )


def _list(puffer_python: str | None) -> str:
    lines = ["backends:"]
    name_w = max(len(b.name) for b in B.REGISTRY.values()) + 2
    library_w = max(len(b.library) for b in B.REGISTRY.values()) + 2
    for b in B.REGISTRY.values():
        reason = check_puffer_python(puffer_python) if b.remote else b.missing()
        state = "available" if not reason else f"skipped: {reason}"
        if not b.by_default:
            state += " (runs when named in --backends" + (f"; measured against {b.versus})" if b.versus else ")")
        lines.append(f"  {b.name:<{name_w}}{b.library:<{library_w}}{b.note}\n  {'':<{name_w + library_w}}{state}")
    lines.append("envs: " + ", ".join(env_names()) + " (busy-<N>us and image-<H>x<W>x<C> take any size)")
    return "\n".join(lines)


def _print(results: dict[str, Any], markdown: bool) -> None:
    if results.get("kind") == scaling.KIND:
        print(scaling.format_markdown(results) if markdown else scaling.format_table(results))
    else:
        print(format_markdown(results) if markdown else format_table(results))


def main(argv: list[str] | None = None) -> int:
    # EnvPool's spaces make Gymnasium warn about float64 bounds cast to float32: noise, not news.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        print(_list(args.puffer_python))
        return 0
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            from shmvec._bench.plot import PLOT_HINT

            parser.error(f"--plot: {PLOT_HINT}")
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        _print(results, args.markdown)
        if args.plot:
            from shmvec._bench.plot import plot_all

            for path in plot_all(results, args.plot):
                print(f"wrote {path}")
        return 0
    try:
        config: Any = (scaling.config_from_args(args, PRESETS["scaling"]) if args.preset == "scaling"
                       else config_from_args(args))
    except ValueError as e:
        parser.error(str(e))
    m = machine()
    print(f"shmvec benchmark: {m['cores']} cores ({m['cpu']}), Python {m['python']}, "
          f"{config.seconds:g} s per backend and point, {config.workers} workers, start method {config.start_method}",
          flush=True)
    progress = Progress(0, enabled=not args.quiet)
    results = scaling.run(config, progress) if args.preset == "scaling" else run(config, progress)
    _print(results, args.markdown)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.plot:
        from shmvec._bench.plot import plot_all

        for path in plot_all(results, args.plot):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
