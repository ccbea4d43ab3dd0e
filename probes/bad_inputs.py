"""Replay issue #10's bad inputs against a checkout and classify what the user sees.

    .venv/bin/python probes/bad_inputs.py --repo . --out bad_inputs.md
    .venv/bin/python probes/bad_inputs.py --repo /tmp/before10 --out /tmp/sweep/before.md
    .venv/bin/python probes/bad_inputs.py --repo . --out x.md --only fit_twice nan_fedavg --timeout 60
    .venv/bin/python probes/bad_inputs.py --list

Every case is one command, ``python -m fedmtl ...``, run as a subprocess of this Python with
``PYTHONPATH=REPO`` (so the checkout under test is imported, not the venv's editable install;
checked once at the start), stdin closed, in a fresh folder holding the case's own inputs.
Once per sweep, with the checkout's own ``fedmtl data synth``: a tiny dataset (12 train + 4
val images of 32x32 per dataset) and one finished run (the tiny scenario of
``tests/helpers.py``, FedAvg, 2 rounds), which the cases that need a run copy. Cases that
touch data get a private copy of the data root.

Outcome of a case, first match wins:

* HANG: not done within the case's time limit (``--timeout``; 60-90 s for the known hangs), or
  killed because its processes together held more than ``--mem-cap-gb`` of memory.
* LOST: a file that existed before the command and must not change (the case says which: the
  run directory, its checkpoints, the dataset; the shared data root always) was deleted or
  changed (SHA-256 before and after; a run's config.yaml without its ``resume`` field). A
  file rewritten with the same content (a rerun of the same seed) is not lost; the note lists it.
* TRACEBACK: stderr holds "Traceback (most recent call last)".
* SILENT: exit code 0 for an input that must be refused; or, for a case that may continue
  with a warning, exit code 0 without that warning (or with the case's sign of a silent
  restart, or NaN reaching other clients' results / training losses).
* CLEAR: non-zero exit and stderr's last non-blank line starts with "error:" (so the error is
  one line) and names what the case asks for (the field, file or client); else VAGUE.
* OK: a case that may continue (``expect`` warn / either) exited 0 with its warning line: a
  stderr line matching all the case's patterns once paths are removed from it (the per-round
  progress line and wandb's own ``wandb:`` lines do not count).

``expect``: refuse (must exit non-zero), warn (must continue with a warning), either (refuse,
or continue and say so in a line), run (a form fedmtl reads right: exit 0, or a clear refusal). The table (``--out``) gives per case the outcome, exit
code, wall time, stderr's last non-blank line (160 characters) and a note; ``OUT.json`` the
same as data, ``OUT_logs/`` each case's full stdout and stderr. Cases run one after another
(about 10-15 s each on 2 cores, most of it imports; a sweep takes 10-15 min).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import json
import math
import os
import pickle
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import TINY  # noqa: E402 - the tests' tiny scenario (3 clients, 32x32)

DATASETS = {"pascal_context": "PASCALContext", "nyud": "NYUDv2"}  # name -> folder under the data root
DIVERGING = "nyud-semseg+depth"  # the client the NaN cases give a huge learning rate
BASE_ROUNDS = 2  # rounds of the shared finished run
TRACEBACK = "Traceback (most recent call last)"
OUTCOMES = ("HANG", "LOST", "TRACEBACK", "SILENT", "VAGUE", "CLEAR", "OK", "SKIP")
PROGRESS = re.compile(r"^round \d+/\d+ ")  # the per-round progress line: never counts as a warning


# ---------------------------------------------------------------------- running one command


@dataclass
class Result:
    rc: int | None  # None: killed
    stdout: str
    stderr: str
    seconds: float
    killed: str | None = None  # why it was killed (time limit, memory)
    leftovers: int = 0  # processes of its session still alive after it exited (then killed)

    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def last_line(self) -> str:
        lines = self.lines()
        return lines[-1].strip() if lines else ""


def _session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (the command and everything it started)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


def _resident_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def _kill_session(proc: subprocess.Popen) -> int:
    """End the command's session (the processes it started); returns how many there were."""
    pids = _session_pids(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _session_pids(proc.pid):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.2)
    for pid in _session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    return len(pids)


def _limited(limits: dict[int, int]) -> Callable[[], None] | None:
    """A preexec function that lowers the child's soft resource limits (``ulimit -f`` / ``-n``)."""
    if not limits:
        return None

    def lower() -> None:
        for which, soft in limits.items():
            resource.setrlimit(which, (soft, resource.getrlimit(which)[1]))

    return lower


def _copying(source: Any, target: Any) -> threading.Thread:
    """A thread copying the pipe ``source`` into the file ``target`` until it closes."""

    def copy() -> None:
        for chunk in iter(lambda: source.read1(65536), b""):
            target.write(chunk)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def run_command(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    mem_cap: float,
    logs: Path,
    limits: dict[int, int] | None = None,
) -> Result:
    """Run ``cmd`` in its own session with stdout/stderr to files; kill it (and all it started)
    at ``timeout`` seconds or when its processes hold more than ``mem_cap`` bytes. ``limits``:
    resource limits of the command (its files, not the probe's)."""
    out_path, err_path = logs.with_suffix(".stdout"), logs.with_suffix(".stderr")
    start = time.monotonic()
    killed = None
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        # Under a file-size limit the command's own writes to a log file would be cut at the
        # limit: its output then goes through pipes that this process copies to the logs.
        piped = subprocess.PIPE if limits else None
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=piped or out,
            stderr=piped or err,
            start_new_session=True,
            preexec_fn=_limited(limits or {}),
        )
        copies = [_copying(proc.stdout, out), _copying(proc.stderr, err)] if limits else []
        next_mem = start
        while proc.poll() is None:
            now = time.monotonic()
            if now - start > timeout:
                killed = f"killed after {timeout:.0f} s"
            elif now >= next_mem:
                next_mem = now + 1.0
                held = _resident_bytes(_session_pids(proc.pid))
                if held > mem_cap:
                    killed = (
                        f"killed at {held / 2**30:.1f} GiB held by {len(_session_pids(proc.pid))} processes"
                    )
            if killed:
                _kill_session(proc)
                break
            time.sleep(0.2)
        seconds = time.monotonic() - start
        for copy in copies:
            copy.join(10)
        leftovers = 0 if killed else len(_session_pids(proc.pid))
        if leftovers:
            _kill_session(proc)
    return Result(
        rc=None if killed else proc.returncode,
        stdout=out_path.read_text(errors="replace"),
        stderr=err_path.read_text(errors="replace"),
        seconds=seconds,
        killed=killed,
        leftovers=leftovers,
    )


# ---------------------------------------------------------------------- the sweep's shared inputs


@dataclass
class Sweep:
    repo: Path
    python: str
    work: Path  # every case's folder and the shared inputs live here
    logs: Path
    timeout: float
    mem_cap: float
    data: Path = field(init=False)  # the shared data root (must never change)
    base_run: Path | None = None  # a finished 2-round FedAvg run of the tiny scenario
    base_config: Path | None = None

    def __post_init__(self) -> None:
        self.data = self.work / "data"

    def env(self, changes: dict[str, str | None] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "FEDMTL_DATA") and not k.startswith("WANDB_")
        }
        env.update(PYTHONPATH=str(self.repo), PYTHONUNBUFFERED="1")
        for key, value in (changes or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def fedmtl(
        self, argv: list[str], cwd: Path, name: str, timeout: float | None = None, env=None, limits=None
    ) -> Result:
        return run_command(
            [self.python, "-m", "fedmtl", *argv],
            cwd=cwd,
            env=self.env(env),
            timeout=timeout or self.timeout,
            mem_cap=self.mem_cap,
            logs=self.logs / name,
            limits=limits,
        )

    def config(self, folder: Path, name: str = "scenario.yaml", data: Path | None = None, **changes) -> Path:
        """The tiny scenario as a YAML file in ``folder`` (1 round unless changed)."""
        cfg = json.loads(json.dumps(TINY))
        cfg["data"]["root"] = str(data or self.data)
        cfg["rounds"] = 1
        cfg.update(changes)
        path = folder / name
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def copy_data(self, folder: Path) -> Path:
        target = folder / "data"
        shutil.copytree(self.data, target)
        return target

    def copy_run(self, folder: Path) -> Path:
        """A copy of the finished run, its config.yaml naming the copy's folder as run_dir."""
        assert self.base_run is not None
        target = folder / "run"
        shutil.copytree(self.base_run, target)
        config = target / "config.yaml"
        config.write_text(config.read_text().replace(str(self.base_run), str(target)))
        return target


def check_import(sweep: Sweep) -> str:
    """The path of the fedmtl package the cases import; exits if it is not the checkout's."""
    result = run_command(
        [sweep.python, "-c", "import fedmtl.cli; print(fedmtl.cli.__file__)"],
        cwd=sweep.work,
        env=sweep.env(),
        timeout=120,
        mem_cap=sweep.mem_cap,
        logs=sweep.logs / "_import",
    )
    path = result.stdout.strip()
    if result.rc != 0 or not Path(path).resolve().is_relative_to(sweep.repo):
        sys.exit(f"fedmtl is imported from {path or '?'}, not from {sweep.repo}:\n{result.stderr}")
    return path


def make_data(sweep: Sweep) -> None:
    for dataset, folder in DATASETS.items():
        argv = ["data", "synth", "--dataset", dataset, "--root", str(sweep.data / folder)]
        argv += ["--num_train", "12", "--num_val", "4", "--size", "[32, 32]", "--workers", "1"]
        result = sweep.fedmtl(argv, cwd=sweep.work, name=f"_synth_{dataset}")
        if result.rc != 0:
            sys.exit(f"`fedmtl {' '.join(argv)}` failed:\n{result.stderr}")


def make_base_run(sweep: Sweep) -> str | None:
    """The finished run that the run cases copy; returns why it failed, or None."""
    sweep.base_config = sweep.config(
        sweep.work, "base.yaml", rounds=BASE_ROUNDS, algorithm={"class_path": "FedAvg"}
    )
    run = sweep.work / "base_run"
    argv = ["fit", "--config", str(sweep.base_config), "--run_dir", str(run)]
    result = sweep.fedmtl(argv, cwd=sweep.work, name="_base_run")
    if result.rc != 0 or not (run / "results.json").is_file():
        return f"the base run failed (rc {result.rc}): {result.last_line()[:160]}"
    sweep.base_run = run
    return None


# ---------------------------------------------------------------------- file hashes


def _content(file: Path) -> bytes:
    """A file's bytes; a run's config.yaml without its ``resume`` field, which a resume records."""
    data = file.read_bytes()
    if file.name == "config.yaml":
        with contextlib.suppress(yaml.YAMLError, AttributeError):
            config = yaml.safe_load(data)
            config.pop("resume", None)
            return yaml.safe_dump(config, sort_keys=True).encode()
    return data


def snapshot(paths: list[Path]) -> dict[str, tuple[str, int]]:
    """SHA-256 and modification time of every file under ``paths`` (files or folders)."""
    hashes = {}
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            with contextlib.suppress(OSError):
                hashes[str(file)] = (hashlib.sha256(_content(file)).hexdigest(), file.stat().st_mtime_ns)
    return hashes


def changed(
    before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]], base: Path
) -> tuple[list[str], list[str]]:
    """Files of ``before`` that are gone or different in ``after`` (lost), and those rewritten
    with the same bytes (a new modification time: e.g. a rerun of the same seed); relative to ``base``."""
    lost, rewritten = [], []
    for path, (digest, mtime) in before.items():
        rel = os.path.relpath(path, base)
        if path not in after:
            lost.append(f"{rel} deleted")
        elif after[path][0] != digest:
            lost.append(f"{rel} changed")
        elif after[path][1] != mtime:
            rewritten.append(rel)
    return lost, rewritten


# ---------------------------------------------------------------------- cases


@dataclass
class Plan:
    """What a case runs and what it checks, built in the case's folder."""

    argv: list[str]
    protect: list[Path] = field(default_factory=list)  # must not change, whatever the exit code
    protect_if_refused: list[Path] = field(default_factory=list)  # must not change when refused
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset
    # after exit code 0 of a warn / either case: a problem that makes it SILENT, or None
    check: Callable[[], str | None] | None = None
    fresh_run: Path | None = None  # a run directory that a refused command should leave empty
    names: tuple[tuple[str, ...], ...] = ()  # more strings the error line must hold (as Case.names)
    cleanup: Callable[[], None] | None = None
    limits: dict[int, int] = field(default_factory=dict)  # resource.RLIMIT_* -> soft limit for the command


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the input, for the table
    expect: str  # refuse, warn, either or run
    prepare: Callable[[Sweep, Path], Plan]
    names: tuple[tuple[str, ...], ...] = ()  # the error line holds one string of each tuple
    forbid: tuple[str, ...] = ()  # stderr must not hold these
    warning: tuple[str, ...] = ()  # regexes one stderr line must all match (warn / either)
    silent_if: str | None = None  # regex: exit code 0 with this in stderr is SILENT
    timeout: float | None = None
    needs_run: bool = False
    skip: Callable[[], str | None] | None = None


CASES: list[Case] = []


def case(name: str, what: str, expect: str = "refuse", **kwargs) -> Callable:
    def register(prepare: Callable[[Sweep, Path], Plan]) -> Callable[[Sweep, Path], Plan]:
        CASES.append(Case(name, what, expect, prepare, **kwargs))
        return prepare

    return register


def fit(config: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), "--run_dir", str(run_dir), *extra]


def metric_rows(run: Path, upto: int) -> list[tuple[str, str, str]]:
    path = run / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [tuple(r) for r in rows if r and r[0].isdigit() and int(r[0]) <= upto]


def rows_kept(run: Path) -> Callable[[], str | None]:
    """A check: metrics.csv keeps the finished rounds' rows as they were (no silent restart)."""
    before = metric_rows(run, BASE_ROUNDS)

    def check() -> str | None:
        after = metric_rows(run, BASE_ROUNDS)
        if after != before:
            counts = f"{len(before)} before, {len(after)} after"
            return f"metrics.csv rows of rounds 1-{BASE_ROUNDS} changed ({counts})"
        return None

    return check


# -- never lose a run ------------------------------------------------------------------------


@case(
    "fit_twice",
    "a second fresh `fit` (`--seed 1`) into a finished run's directory",
    names=(("resume",), ("overwrite",)),
    needs_run=True,
)
def _fit_twice(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    return Plan(fit(sweep.base_config, run, "--seed", "1"), protect=[run])


def _bad_latest(content: bytes) -> Callable[[Sweep, Path], Plan]:
    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        run = sweep.copy_run(tmp)
        (run / "checkpoints" / "latest").write_bytes(content)
        rounds = sorted(p for p in (run / "checkpoints").glob("round_*") if p.is_dir())
        return Plan(
            fit(sweep.base_config, run, "--resume", "true"),
            protect=rounds,
            protect_if_refused=[run],
            check=rows_kept(run),
        )

    return prepare


LATEST_WARNING = (r"latest", r"corrupt|invalid|missing|unreadable|not found|does not|doesn't|bad|ignor|fall")
case(
    "resume_latest_garbage",
    "`--resume true` with checkpoints/latest overwritten by 64 random bytes",
    "either",
    names=(("latest", "checkpoint"),),
    warning=LATEST_WARNING,
    silent_if=r"starting from round 1",
    needs_run=True,
)(_bad_latest(bytes(random.Random(0).randrange(256) for _ in range(64))))
case(
    "resume_latest_missing",
    "`--resume true` with checkpoints/latest naming a missing folder (round_0009)",
    "either",
    names=(("latest", "checkpoint", "round_0009"),),
    warning=LATEST_WARNING,
    silent_if=r"starting from round 1",
    needs_run=True,
)(_bad_latest(b"round_0009\n"))


@case("synth_over_dataset", "`data synth --seed 1 --root` an existing NYUDv2 folder", names=(("NYUDv2",),))
def _synth_over_dataset(sweep: Sweep, tmp: Path) -> Plan:
    data = sweep.copy_data(tmp)
    argv = ["data", "synth", "--dataset", "nyud", "--root", str(data / "NYUDv2"), "--seed", "1"]
    argv += ["--num_train", "12", "--num_val", "4", "--size", "[32, 32]", "--workers", "1"]
    return Plan(argv, protect=[data])


@case(
    "failed_fit_over_run",
    "`fit --rounds 0` into a finished run's directory",
    names=(("rounds",),),
    needs_run=True,
)
def _failed_fit_over_run(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    return Plan(fit(sweep.base_config, run, "--rounds", "0"), protect=[run])


@case(
    "failed_resume_missing_data",
    "`--resume true --data.root EMPTY` of a finished run",
    names=(("PASCALContext", "NYUDv2"),),
    needs_run=True,
)
def _failed_resume_missing_data(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    (tmp / "empty").mkdir()
    return Plan(
        fit(sweep.base_config, run, "--resume", "true", "--data.root", str(tmp / "empty")), protect=[run]
    )


# -- never spread a NaN ----------------------------------------------------------------------


def _nan_config(sweep: Sweep, tmp: Path) -> Path:
    cfg = json.loads(json.dumps(TINY["clients"]))
    cfg[1]["optimizer"] = {"lr": 1.0e6, "warmup_epochs": 0}  # the warm-up would start at 1.25e-7
    return sweep.config(tmp, clients=cfg, rounds=2)


def _finite_elsewhere(run: Path) -> str | None:
    """Non-finite values of the other clients in results.json or in metrics.csv's train / val rows."""
    path = run / "results.json"
    if not path.is_file():
        return "no results.json"
    problems = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}/{k}")
        elif isinstance(value, list):
            for k, v in enumerate(value):
                walk(v, f"{where}/{k}")
        elif DIVERGING not in where and (
            value is None or isinstance(value, float) and not math.isfinite(value)
        ):
            problems.append(f"results.json{where}={value}")

    walk(json.loads(path.read_text()), "")
    for round_, key, value in metric_rows(run, 10**6):
        if key.startswith(("train/", "val")) and DIVERGING not in key and not math.isfinite(float(value)):
            problems.append(f"metrics.csv round {round_} {key}={value}")
    if problems:
        return f"NaN reached other clients ({len(problems)} values, e.g. {problems[0]})"
    return None


def _nan(algorithm: str, *extra: str) -> Callable[[Sweep, Path], Plan]:
    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        run = tmp / "run"
        return Plan(
            fit(_nan_config(sweep, tmp), run, "--algorithm", algorithm, *extra),
            check=lambda: _finite_elsewhere(run),
            fresh_run=run,
        )

    return prepare


NAN_WARNING = (re.escape(DIVERGING), r"nan|non-?finite|\binf|diverg")
for _algorithm in ("FedAvg", "Local", "FedHCA2", "Ditto"):
    case(
        f"nan_{_algorithm.lower()}",
        f"`--algorithm {_algorithm}`, NYUD group `optimizer: {{lr: 1.0e6, warmup_epochs: 0}}`, 2 rounds",
        "warn",
        names=((DIVERGING,),),
        warning=NAN_WARNING,
    )(_nan(_algorithm))
case(
    "nan_stop",
    "as nan_fedavg with `--nonfinite stop`",
    names=((DIVERGING,),),
)(_nan("FedAvg", "--nonfinite", "stop"))


# -- resume with a changed config ------------------------------------------------------------


def _resume(*extra: str, fewer_groups: bool = False) -> Callable[[Sweep, Path], Plan]:
    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        run = sweep.copy_run(tmp)
        config = sweep.base_config
        if fewer_groups:
            config = sweep.config(
                tmp, clients=TINY["clients"][:1], rounds=BASE_ROUNDS, algorithm={"class_path": "FedAvg"}
            )
        return Plan(fit(config, run, "--resume", "true", *extra), protect_if_refused=[run])

    return prepare


case(
    "resume_more_rounds",
    f"`--resume true --rounds 3` of a finished {BASE_ROUNDS}-round run",
    "either",
    names=(("rounds",),),
    warning=(r"\brounds\b", r"\b2\b", r"\b3\b"),
    needs_run=True,
)(_resume("--rounds", "3"))
case(
    "resume_fewer_rounds",
    f"`--resume true --rounds 1` of a finished {BASE_ROUNDS}-round run",
    "either",
    names=(("rounds",),),
    warning=(r"\brounds\b", r"\b2\b", r"\b1\b"),
    needs_run=True,
)(_resume("--rounds", "1"))
case(
    "resume_fewer_clients",
    "`--resume true` of a FedAvg run with the NYUD client group removed from the config",
    "either",
    names=(("client",),),
    warning=(r"client", r"chang|differ|fewer|remov|missing|\b3\b"),
    needs_run=True,
)(_resume(fewer_groups=True))


# -- config values rejected at config time ---------------------------------------------------


def _fresh(*extra: str, optimizer: dict | None = None) -> Callable[[Sweep, Path], Plan]:
    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        changes = {}
        if optimizer is not None:
            changes["clients"] = [dict(group, optimizer=optimizer) for group in TINY["clients"]]
        run = tmp / "run"
        return Plan(fit(sweep.config(tmp, **changes), run, *extra), fresh_run=run)

    return prepare


for _name, _what, _field, _prepare in [
    ("rounds_0", "`--rounds 0`", "rounds", _fresh("--rounds", "0")),
    ("rounds_negative", "`--rounds -1`", "rounds", _fresh("--rounds", "-1")),
    (
        "eval_batch_size_0",
        "`--evaluation.batch_size 0`",
        "batch_size",
        _fresh("--evaluation.batch_size", "0"),
    ),
    ("eval_every_negative", "`--evaluation.every -2`", "every", _fresh("--evaluation.every", "-2")),
    (
        "checkpoint_every_negative",
        "`--checkpoint_every -1`",
        "checkpoint_every",
        _fresh("--checkpoint_every", "-1"),
    ),
    ("lr_zero", "`optimizer: {lr: 0}` in every group", "lr", _fresh(optimizer={"lr": 0.0})),
    ("lr_negative", "`optimizer: {lr: -0.001}` in every group", "lr", _fresh(optimizer={"lr": -0.001})),
    ("cpu_threads_0", "`--cpu_threads 0`", "cpu_threads", _fresh("--cpu_threads", "0")),
    (
        "alpha_init_1_5",
        "`--algorithm FedHCA2 --algorithm.alpha_init 1.5`",
        "alpha_init",
        _fresh("--algorithm", "FedHCA2", "--algorithm.alpha_init", "1.5"),
    ),
    ("train_size_8", "`--data.train_size [8,8]`", "train_size", _fresh("--data.train_size", "[8, 8]")),
    ("unknown_algorithm", "`--algorithm Nope`", "Nope", _fresh("--algorithm", "Nope")),
]:
    case(_name, _what, names=((_field,),))(_prepare)

case(
    "accelerator_gpu",
    "`--accelerator gpu` (no GPU here)",
    "either",
    names=(("gpu", "accelerator", "cuda"),),
    warning=(r"gpu|cuda", r"cpu|not available|unavailable|no gpu|none"),
)(_fresh("--accelerator", "gpu"))
case(
    "devices_64",
    "`--devices 64` (2 cores)",
    "either",
    names=(("devices",),),
    warning=(r"devices", r"core|cpu|reduc|more than|cap|only"),
    timeout=60,
)(_fresh("--devices", "64"))
case(
    "num_nodes_2",
    "`--num_nodes 2` without a launcher",
    "either",
    names=(("num_nodes", "launcher", "torchrun"),),
    warning=(r"num_nodes|launcher|torchrun|slurm",),
    timeout=60,
)(_fresh("--num_nodes", "2"))


# -- files that are not what they should be ---------------------------------------------------


def _pretrained(write: Callable[[Path], None] | None, name: str) -> Callable[[Sweep, Path], Plan]:
    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        path = tmp / name
        if write is not None:
            write(path)
        run = tmp / "run"
        return Plan(fit(sweep.config(tmp), run, "--model.pretrained_file", str(path)), fresh_run=run)

    return prepare


def _random_tensors(path: Path) -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    tensors = {
        "stem.weight": torch.randn(7, 3, 5, 5, generator=generator),
        "head.bias": torch.randn(11, generator=generator),
        "blocks.0.mlp.fc1.weight": torch.randn(13, 17, generator=generator),
    }
    torch.save(tensors, path)


for _name, _what, _write, _file in [
    (
        "pretrained_random_tensors",
        "a torch file of 3 unrelated random tensors",
        _random_tensors,
        "weights.pt",
    ),
    (
        "pretrained_yaml",
        "a YAML file",
        lambda p: p.write_text("backbone: resnet\nlayers: [1, 2]\n"),
        "weights.yaml",
    ),
    ("pretrained_json", "a JSON file", lambda p: p.write_text('{"weights": [1, 2, 3]}\n'), "weights.json"),
    (
        "pretrained_pickled_list",
        "a pickled list",
        lambda p: p.write_bytes(pickle.dumps([1, 2, 3])),
        "weights.pkl",
    ),
    ("pretrained_missing", "a file that does not exist", None, "missing.pt"),
]:
    case(_name, f"`--model.pretrained_file` {_what}", names=((_file,),))(_pretrained(_write, _file))


def _corrupt_client(command: str) -> Callable[[Sweep, Path], Plan]:
    """Issue #26: a checkpoint file that no longer matches its SHA256SUMS is named, and the
    command falls back to the checkpoint before it; a resume then republishes the round and
    keeps the damaged folder as round_NNNN.superseded, byte for byte."""

    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        run = sweep.copy_run(tmp)
        checkpoints = run / "checkpoints"
        path = checkpoints / f"round_{BASE_ROUNDS:04d}" / "client_0000.pt"
        damaged = path.read_bytes()[: path.stat().st_size // 2]
        path.write_bytes(damaged)
        previous = checkpoints / f"round_{BASE_ROUNDS - 1:04d}"  # the fallback must stay as it is
        if command == "validate":
            return Plan(["validate", "--run_dir", str(run)], protect=[checkpoints])

        def damaged_kept() -> str | None:
            kept = checkpoints / f"round_{BASE_ROUNDS:04d}.superseded" / "client_0000.pt"
            if not kept.is_file() or kept.read_bytes() != damaged:
                return f"the damaged file is not kept as {kept.relative_to(run)}"
            return None

        return Plan(fit(sweep.base_config, run, "--resume", "true"), protect=[previous], check=damaged_kept)

    return prepare


for _command, _what in [("resume", "`fit --resume true`"), ("validate", "`validate --run_dir`")]:
    case(
        f"corrupt_checkpoint_{_command}",
        f"{_what} with checkpoints/round_{BASE_ROUNDS:04d}/client_0000.pt truncated to half",
        expect="warn",
        warning=(
            r"checkpoint round_\d+ skipped",
            r"does not match the sha256",
            r"falling back to round_",
        ),
        needs_run=True,
    )(_corrupt_client(_command))


def _first_train_image(data: Path) -> Path:
    first = (data / "PASCALContext/ImageSets/Context/train.txt").read_text().split()[0]
    return data / "PASCALContext" / "JPEGImages" / f"{first}.jpg"


@case("corrupt_image", "a fresh fit whose first PASCAL-Context training JPEG is garbage (data copy)")
def _corrupt_image(sweep: Sweep, tmp: Path) -> Plan:
    data = sweep.copy_data(tmp)
    image = _first_train_image(data)
    image.write_bytes(b"this is not a JPEG\n" * 8)
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp, data=data), run), fresh_run=run, names=((image.name,),))


# -- issue #36: data that is almost right, the OS saying no, a recorded config --------------


def _nyud_first(data: Path, folder: str, suffix: str = ".png") -> Path:
    first = (data / "NYUDv2/gt_sets/train.txt").read_text().split()[0]
    return data / "NYUDv2" / folder / f"{first}{suffix}"


def _damaged_data_fit(damage: Callable[[Path], Path]) -> Callable[[Sweep, Path], Plan]:
    """A fresh fit on a copy of the data with one file damaged; the error names that file."""

    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        data = sweep.copy_data(tmp)
        file = damage(data)
        run = tmp / "run"
        return Plan(
            fit(sweep.config(tmp, data=data), run), fresh_run=run, names=((file.name,),), protect=[data]
        )

    return prepare


def _damaged_data_check(damage: Callable[[Path], Path]) -> Callable[[Sweep, Path], Plan]:
    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        data = sweep.copy_data(tmp)
        file = damage(data)
        return Plan(["data", "check", "--root", str(data)], names=((file.name,),), protect=[data])

    return prepare


def _label_value(value: int) -> Callable[[Path], Path]:
    def damage(data: Path) -> Path:
        from PIL import Image

        label = _nyud_first(data, "segmentation")
        pixels = Image.open(label)
        pixels.paste(value, (0, 0, pixels.width, pixels.height))
        pixels.save(label)
        return label

    return damage


def _label_rgb(data: Path) -> Path:
    from PIL import Image

    label = _nyud_first(data, "segmentation")
    Image.open(label).convert("RGB").save(label)
    return label


def _image_16bit(data: Path) -> Path:
    import numpy as np
    from PIL import Image

    image = _nyud_first(data, "images")
    grey = np.asarray(Image.open(image).convert("L"), dtype=np.uint16) * 257
    Image.fromarray(grey).save(image)  # uint16: mode I;16
    return image


for _what, _damage, _expect in [
    (
        "a NYUD segmentation label filled with class value 100 (past the 40 classes, not 255)",
        _label_value(100),
        "refuse",
    ),
    ("a NYUD segmentation label re-saved as RGB (three equal channels)", _label_rgb, "run"),
    ("a NYUD input image re-saved as a 16-bit grey PNG", _image_16bit, "run"),
]:
    _key = {"refuse": "label_class_100", "run": None}[_expect] or _damage.__name__.strip("_")
    case(f"fit_{_key}", f"a fresh fit on {_what}", _expect)(_damaged_data_fit(_damage))
    case(f"check_{_key}", f"`data check` on {_what}", _expect)(_damaged_data_check(_damage))


@case(
    "check_broken_link",
    "`data check` of a root whose NYUDv2 folder is a broken symlink",
    names=(("NYUDv2",),),
)
def _check_broken_link(sweep: Sweep, tmp: Path) -> Plan:
    data = sweep.copy_data(tmp)
    shutil.rmtree(data / "NYUDv2")
    (data / "NYUDv2").symlink_to(tmp / "gone")
    return Plan(["data", "check", "--root", str(data)])


@case("fit_symlink_loop", "a fresh fit whose NYUDv2 folder is a symlink loop", names=(("NYUDv2", "loop"),))
def _fit_symlink_loop(sweep: Sweep, tmp: Path) -> Plan:
    data = sweep.copy_data(tmp)
    shutil.rmtree(data / "NYUDv2")
    (data / "NYUDv2").symlink_to(data / "NYUDv2")
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp, data=data), run), fresh_run=run)


@case("synth_under_file", "`data synth --root` a folder under a regular file", names=(("notes.txt",),))
def _synth_under_file(sweep: Sweep, tmp: Path) -> Plan:
    (tmp / "notes.txt").write_text("mine\n")
    argv = ["data", "synth", "--dataset", "nyud", "--root", str(tmp / "notes.txt" / "NYUDv2")]
    return Plan(
        argv + ["--num_train", "4", "--num_val", "2", "--size", "[32, 32]"], protect=[tmp / "notes.txt"]
    )


@case("synth_zero_train", "`data synth --num_train 0`", names=(("num_train",),))
def _synth_zero_train(sweep: Sweep, tmp: Path) -> Plan:
    argv = ["data", "synth", "--dataset", "nyud", "--root", str(tmp / "NYUDv2")]
    return Plan(argv + ["--num_train", "0", "--num_val", "2", "--size", "[32, 32]"])


@case("yaml_duplicate_key", "a config file holding `rounds:` twice", names=(("rounds",),))
def _yaml_duplicate_key(sweep: Sweep, tmp: Path) -> Plan:
    config = sweep.config(tmp)
    config.write_text(config.read_text() + "rounds: 5\n")
    return Plan(fit(config, tmp / "run"), fresh_run=tmp / "run")


def _fsize(limit: int) -> dict[int, int]:
    return {resource.RLIMIT_FSIZE: limit}


@case(
    "fit_file_size_limit",
    "a fresh fit under `ulimit -f` 256 KiB (a checkpoint cannot be written)",
    names=(("too large",),),
)
def _fit_file_size_limit(sweep: Sweep, tmp: Path) -> Plan:
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run), limits=_fsize(256 * 1024))


@case("fit_open_files_limit", "a fresh fit under `ulimit -n` 40", "run", names=(("open files",),))
def _fit_open_files_limit(sweep: Sweep, tmp: Path) -> Plan:
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run), limits={resource.RLIMIT_NOFILE: 40})


@case("run_dir_under_file", "`--run_dir` a folder under a regular file", names=(("notes.txt",),))
def _run_dir_under_file(sweep: Sweep, tmp: Path) -> Plan:
    (tmp / "notes.txt").write_text("mine\n")
    return Plan(fit(sweep.config(tmp), tmp / "notes.txt" / "run"), protect=[tmp / "notes.txt"])


def _no_zero_scores(run: Path) -> None:
    """Two rounds of the tiny run may score an mIoU of 0, against which Δm is undefined: such
    scores become 0.5 in the copy's results.json (the cases test writing, not scoring)."""

    def lift(value):
        if isinstance(value, dict):
            return {k: lift(v) for k, v in value.items()}
        if isinstance(value, list):
            return [lift(v) for v in value]
        return 0.5 if isinstance(value, float) and value == 0.0 else value

    path = run / "results.json"
    path.write_text(json.dumps(lift(json.loads(path.read_text()))))


def _report_replacing(option: str, name: str) -> Callable[[Sweep, Path], Plan]:
    """``report --OPTION old --overwrite true`` where the new file cannot be written in full: the
    old one stays byte for byte."""

    def prepare(sweep: Sweep, tmp: Path) -> Plan:
        run = sweep.copy_run(tmp)
        _no_zero_scores(run)
        old = tmp / name
        old.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(4096)))
        argv = ["report", str(run), "--baseline", str(run), option, str(old), "--overwrite", "true"]
        return Plan(argv, protect=[old], limits=_fsize(256))

    return prepare


case(
    "report_output_file_size_limit",
    "`report --output old.md --overwrite true` under `ulimit -f` 256 bytes",
    names=(("old.md",), ("too large",)),
    needs_run=True,
)(_report_replacing("--output", "old.md"))
case(
    "report_curves_file_size_limit",
    "`report --curves old.png --overwrite true` under `ulimit -f` 256 bytes",
    names=(("old.png",), ("too large",)),
    needs_run=True,
)(_report_replacing("--curves", "old.png"))


@case(
    "resume_lost_config_new_seed",
    "`--resume true --seed 1` of a finished run whose config.yaml was deleted",
    names=(("seed",),),
    needs_run=True,
)
def _resume_lost_config(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    (run / "config.yaml").unlink()
    return Plan(fit(sweep.base_config, run, "--resume", "true", "--seed", "1"), protect=[run])


@case(
    "resume_without_config",
    "`fit --run_dir R --resume true` of a finished run, without `--config`",
    "run",
    needs_run=True,
)
def _resume_without_config(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    return Plan(["fit", "--run_dir", str(run), "--resume", "true"], protect=[run])


@case(
    "validate_reordered_groups",
    "`validate --run_dir R` after R's config.yaml had its two client groups swapped",
    names=(("client",),),
    needs_run=True,
)
def _validate_reordered(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["clients"] = config["clients"][::-1]
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return Plan(["validate", "--run_dir", str(run)], protect=[run / "checkpoints"])


@case(
    "resume_truncated_no_sums",
    f"`--resume true` with round_{BASE_ROUNDS:04d}/client_0000.pt truncated and its SHA256SUMS deleted",
    expect="warn",
    warning=(r"round_\d+", r"skip|fall"),
    needs_run=True,
)
def _resume_truncated_no_sums(sweep: Sweep, tmp: Path) -> Plan:
    run = sweep.copy_run(tmp)
    folder = run / "checkpoints" / f"round_{BASE_ROUNDS:04d}"
    path = folder / "client_0000.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    (folder / "SHA256SUMS").unlink()
    previous = run / "checkpoints" / f"round_{BASE_ROUNDS - 1:04d}"
    return Plan(fit(sweep.base_config, run, "--resume", "true"), protect=[previous])


# -- environment -----------------------------------------------------------------------------


@case(
    "wandb_online_no_account",
    "`--logger.wandb true --logger.mode online`, no WANDB_API_KEY, empty HOME, no network",
    "either",
    names=(("wandb",),),
    warning=(r"wandb", r"offline|account|api.?key|log ?in|online"),
    timeout=90,
)
def _wandb_online(sweep: Sweep, tmp: Path) -> Plan:
    home = tmp / "home"
    home.mkdir()
    run = tmp / "run"
    argv = fit(sweep.config(tmp), run, "--logger.wandb", "true", "--logger.mode", "online")
    return Plan(argv, env={"HOME": str(home), "WANDB_API_KEY": None}, fresh_run=run)


def _read_only_skip() -> str | None:
    return "running as root: a read-only folder is writable" if os.geteuid() == 0 else None


@case(
    "read_only_parent",
    "run_dir under a folder with mode 555",
    skip=_read_only_skip,
)
def _read_only(sweep: Sweep, tmp: Path) -> Plan:
    parent = tmp / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    return Plan(
        fit(sweep.config(tmp), parent / "run"),
        names=((str(parent), "permission", "read-only", "writable"),),
        cleanup=lambda: parent.chmod(0o755),
    )


@case(
    "missing_data",
    "`--data.root` an empty folder",
    names=(("PASCALContext", "NYUDv2"), ("fedmtl data synth",)),
    forbid=("make demo",),
)
def _missing_data(sweep: Sweep, tmp: Path) -> Plan:
    (tmp / "empty").mkdir()
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run, "--data.root", str(tmp / "empty")), fresh_run=run)


@case("config_missing", "`--config` a file that does not exist", names=(("nope.yaml",),))
def _config_missing(sweep: Sweep, tmp: Path) -> Plan:
    return Plan(fit(tmp / "nope.yaml", tmp / "run"), fresh_run=tmp / "run")


@case("config_yaml_syntax", "`--config` a file with a YAML syntax error", names=(("broken.yaml",),))
def _config_yaml_syntax(sweep: Sweep, tmp: Path) -> Plan:
    path = tmp / "broken.yaml"
    path.write_text(
        f"clients:\n  - {{dataset: nyud, tasks: [semseg, depth]\ndata: {{root: {sweep.data}}}\nrounds: 1\n"
    )
    return Plan(fit(path, tmp / "run"), fresh_run=tmp / "run")


# -- issue #37: the researcher's loop --------------------------------------------------------


@case(
    "clients_index_past_last", "`--clients.7.local_epochs 2` on a two-group config", names=(("clients.7",),)
)
def _clients_index_past_last(sweep: Sweep, tmp: Path) -> Plan:
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run, "--clients.7.local_epochs", "2"), fresh_run=run)


@case("logger_tags_empty", "`--logger.tags '[\"\"]'`: an empty wandb tag", names=(("logger.tags",),))
def _logger_tags_empty(sweep: Sweep, tmp: Path) -> Plan:
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run, "--logger.tags", '[""]'), fresh_run=run)


@case("checkpoint_keep_zero", "`--checkpoint_keep 0`", names=(("checkpoint_keep",),))
def _checkpoint_keep_zero(sweep: Sweep, tmp: Path) -> Plan:
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run, "--checkpoint_keep", "0"), fresh_run=run)


@case("train_size_below_images", "`--data.train_size [16,16]` on 32x32 data", names=(("data.train_size",),))
def _train_size_below_images(sweep: Sweep, tmp: Path) -> Plan:
    run = tmp / "run"
    return Plan(fit(sweep.config(tmp), run, "--data.train_size", "[16,16]"), fresh_run=run)


@case("synth_render_scale_zero", "`data synth --render_scale 0`", names=(("render_scale",),))
def _synth_render_scale_zero(sweep: Sweep, tmp: Path) -> Plan:
    root = tmp / "new"
    argv = ["data", "synth", "--dataset", "nyud", "--root", str(root), "--render_scale", "0"]
    return Plan(argv, fresh_run=root)


@case(
    "warmup_only_run",
    "1 round of a config whose clients warm up for 5 epochs: trains at the warm-up start rate",
    expect="warn",
    warning=(r"warm-up", r"--rounds \d+"),
)
def _warmup_only_run(sweep: Sweep, tmp: Path) -> Plan:
    return Plan(fit(sweep.config(tmp), tmp / "run"))


# ---------------------------------------------------------------------- classification


def _warned(case_: Case, result: Result) -> bool:
    for line in result.lines():
        if PROGRESS.match(line) or line.startswith("wandb:"):
            continue  # the progress line and wandb's own messages are not the project's warning
        words = re.sub(r"\S*/\S*", "", line)  # paths (the case's folder name) do not count
        if all(re.search(pattern, words, re.IGNORECASE) for pattern in case_.warning):
            return True
    return False


def _clear_or_vague(case_: Case, plan: Plan, result: Result) -> tuple[str, str]:
    last = result.last_line()
    if not last.startswith("error:"):
        return "VAGUE", f"the last line is not an `error:` line ({len(result.lines())} stderr lines)"
    missing = [
        " / ".join(alts)
        for alts in case_.names + plan.names
        if not any(a.lower() in last.lower() for a in alts)
    ]
    if missing:
        return "VAGUE", f"the error line does not name {'; '.join(missing)}"
    forbidden = [text for text in case_.forbid if text in result.stderr]
    if forbidden:
        return "VAGUE", f"stderr suggests {', '.join(forbidden)}"
    return "CLEAR", ""


def _exception(result: Result) -> str:
    for line in reversed(result.lines()):
        match = re.match(r"^([\w.]+(Error|Exception|Interrupt|Exit))\b", line.strip())
        if match:
            return match.group(1)
    return "?"


def classify(case_: Case, plan: Plan, result: Result, lost: list[str]) -> tuple[str, str]:
    if result.killed:
        return "HANG", result.killed
    if lost:
        return "LOST", f"{len(lost)} files: {', '.join(lost[:3])}" + (" ..." if len(lost) > 3 else "")
    if TRACEBACK in result.stderr:
        return "TRACEBACK", _exception(result)
    if result.rc != 0:
        outcome, note = _clear_or_vague(case_, plan, result)
        if case_.expect == "warn":
            note = "; ".join(filter(None, ["refused; expected to continue with a warning", note]))
        return outcome, note
    if case_.expect == "refuse":
        return "SILENT", "exit code 0"
    if case_.expect == "run":
        problem = plan.check() if plan.check else None
        return ("SILENT", problem) if problem else ("OK", "")
    if case_.silent_if and re.search(case_.silent_if, result.stderr, re.IGNORECASE):
        match = re.search(rf".*{case_.silent_if}.*", result.stderr, re.IGNORECASE)
        return "SILENT", f"exit code 0, stderr: {match.group(0).strip()[:100]}"
    problem = plan.check() if plan.check else None
    if not _warned(case_, result):
        return "SILENT", "; ".join(filter(None, ["exit code 0, no warning line", problem]))
    if problem:
        return "SILENT", f"warned, but {problem}"
    return "OK", ""


# ---------------------------------------------------------------------- the sweep


@dataclass
class Row:
    name: str
    what: str
    expect: str
    outcome: str
    rc: int | None
    seconds: float
    last_line: str
    note: str


def run_case(sweep: Sweep, case_: Case, base_failure: str | None) -> Row:
    def row(outcome: str, note: str, result: Result | None = None) -> Row:
        return Row(
            case_.name,
            case_.what,
            case_.expect,
            outcome,
            result.rc if result else None,
            round(result.seconds, 1) if result else 0.0,
            result.last_line()[:160] if result else "",
            note,
        )

    skip = case_.skip() if case_.skip else None
    if skip or (case_.needs_run and base_failure):
        return row("SKIP", skip or base_failure)
    tmp = sweep.work / case_.name
    tmp.mkdir()
    plan = case_.prepare(sweep, tmp)
    data = snapshot([sweep.data])
    always = snapshot(plan.protect)
    if_refused = snapshot(plan.protect_if_refused)
    try:
        result = sweep.fedmtl(
            plan.argv, cwd=tmp, name=case_.name, timeout=case_.timeout, env=plan.env, limits=plan.limits
        )
    finally:
        if plan.cleanup:
            plan.cleanup()
    lost, rewritten = changed(always, snapshot(plan.protect), sweep.work)
    if result.rc != 0:
        more_lost, more_rewritten = changed(if_refused, snapshot(plan.protect_if_refused), sweep.work)
        lost, rewritten = lost + more_lost, rewritten + more_rewritten
    data_lost, data_rewritten = changed(data, snapshot([sweep.data]), sweep.work)
    lost, rewritten = lost + data_lost, rewritten + data_rewritten
    if data_lost or data_rewritten:  # put the shared data back for the next cases
        shutil.rmtree(sweep.data)
        shutil.copytree(sweep.work / "data.pristine", sweep.data)
    outcome, note = classify(case_, plan, result, sorted(set(lost)))
    extra = []
    rewritten = sorted(set(rewritten))
    if rewritten:
        extra.append(f"rewrote {len(rewritten)} files, content unchanged: {', '.join(rewritten[:3])}")
        extra[-1] += " ..." if len(rewritten) > 3 else ""
    if result.rc not in (0, None) and plan.fresh_run is not None and plan.fresh_run.is_dir():
        written = sorted(os.path.relpath(p, plan.fresh_run) for p in plan.fresh_run.rglob("*") if p.is_file())
        if written:
            extra.append(
                f"refused after writing {', '.join(written[:3])}" + (" ..." if len(written) > 3 else "")
            )
    if result.leftovers:
        extra.append(f"left {result.leftovers} processes running (killed)")
    return row(outcome, "; ".join(filter(None, [note, *extra])), result)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_table(path: Path, rows: list[Row], header: dict[str, str]) -> None:
    counts = Counter(r.outcome for r in rows)
    lines = ["# Bad inputs (issues #10, #26, #36, #37)", ""]
    lines += [f"- {key}: {_cell(value)}" for key, value in header.items()]
    lines += ["", "| outcome | cases |", "|---|---|"]
    lines += [f"| {o} | {counts[o]} |" for o in OUTCOMES if counts[o]]
    lines += [f"| total | {len(rows)} |", ""]
    lines += ["| case | input | expect | outcome | rc | s | stderr's last line | note |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rc = "-" if r.rc is None else r.rc
        cells = [
            r.name,
            r.what,
            r.expect,
            f"**{r.outcome}**",
            rc,
            r.seconds,
            f"`{r.last_line}`" if r.last_line else "",
            r.note,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(
        json.dumps({"header": header, "counts": dict(counts), "cases": [r.__dict__ for r in rows]}, indent=1)
    )


def _head_commit(repo: Path) -> str:
    """The checkout's HEAD, read from its git files (no git command)."""
    with contextlib.suppress(OSError, IndexError):
        git = repo / ".git"
        gitdir = Path(git.read_text().split(":", 1)[1].strip()) if git.is_file() else git
        head = (gitdir / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        common = gitdir / "commondir"
        roots = [gitdir] + ([(gitdir / common.read_text().strip()).resolve()] if common.is_file() else [])
        for root in roots:
            if (root / ref).is_file():
                return (root / ref).read_text().strip()
            packed = root / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    return "?"


@contextlib.contextmanager
def workdir(path: str | None, keep: bool) -> Iterator[Path]:
    work = Path(path) if path else Path(tempfile.mkdtemp(prefix="bad_inputs_"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        sys.exit(f"--workdir {work} is not empty")
    try:
        yield work.resolve()
    finally:
        if not keep:
            for folder in work.rglob("*"):  # a case may leave a read-only folder
                if folder.is_dir() and not folder.is_symlink():
                    with contextlib.suppress(OSError):
                        folder.chmod(folder.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, help="the checkout to test (its fedmtl is imported)")
    parser.add_argument("--out", type=Path, help="the markdown table to write (and OUT.json, OUT_logs/)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these cases")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per case (the hang cases: less)")
    parser.add_argument("--python", default=sys.executable, help="the Python with fedmtl's dependencies")
    parser.add_argument("--workdir", help="an empty folder for the cases (default: a new temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--mem-cap-gb", type=float, default=6.0, help="kill a case whose processes hold more")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    if args.list:
        for c in CASES:
            print(f"{c.name:28s} {c.expect:7s} {c.what}")
        return
    if args.repo is None or args.out is None:
        parser.error("--repo and --out are required")
    unknown = sorted(set(args.only or ()) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown cases {unknown}; --list shows them")
    cases = [c for c in CASES if not args.only or c.name in args.only]
    repo = args.repo.resolve()
    out = args.out.resolve()
    logs = out.parent / f"{out.stem}_logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with workdir(args.workdir, args.keep) as work:
        sweep = Sweep(repo, args.python, work, logs, args.timeout, args.mem_cap_gb * 2**30)
        imported = check_import(sweep)
        print(f"fedmtl from {imported}; data and base run in {work}", file=sys.stderr)
        make_data(sweep)
        shutil.copytree(sweep.data, work / "data.pristine")
        base_failure = make_base_run(sweep) if any(c.needs_run for c in cases) else None
        rows = []
        for c in cases:
            rows.append(run_case(sweep, c, base_failure))
            r = rows[-1]
            print(
                f"{r.name:28s} {r.outcome:9s} rc={r.rc} {r.seconds:5.1f}s  {r.last_line[:90]}",
                file=sys.stderr,
            )
    header = {
        "checkout": f"{repo} (HEAD {_head_commit(repo)[:12]}; working-tree changes included)",
        "fedmtl imported from": imported,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now().isoformat(timespec="seconds"),
        "sweep time": f"{time.monotonic() - started:.0f} s",
        "logs": str(logs),
    }
    write_table(out, rows, header)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
