"""Compare finished runs: one row per method, one column per client task, and Δm against a baseline.

    fedmtl report runs/local runs/fedavg runs/fedhca2                  # markdown table on stdout
    fedmtl report runs/*-s? --baseline runs/local-s0 --format latex    # seeds grouped, LaTeX
    fedmtl report runs/* --format csv --output table.csv --curves curves.png
    fedmtl report runs/* --partition partition.png   # each client's images per dominant class

What the report reads. A run directory's ``results.json`` (the final metrics of the model the
method reports, ``"clients"``) is all it needs; ``config.yaml``, when present, gives the seed
of runs written before results.json recorded it and tells which runs share a config. The
curves read ``metrics.csv`` (``val/<client>/<task>_<metric>`` every evaluation round); the
partition figure reads each client's ``class_histogram`` in results.json.

Scoring. The runs compared must be scored the same way: every option that changes a metric's
number (``evaluation.edge_thin_gt``, the padding size ``data.train_size``, the validation
split; ``fedmtl.federated.scoring``) is equal across them, or the report is refused naming the
option, its two values and the two runs. results.json records them under ``"scoring"``; for a
run written before it did, config.yaml and data_fingerprint.json say what they can, and an
option neither says is not compared.

Rows. Runs whose config differs only in the seed (and in where and how they ran: the fields
a resume may change, ``fedmtl.federated.rundir.RESUMABLE_FIELDS``) are one method. Without
config.yaml, runs of the same algorithm, evaluated model and number of rounds are grouped. A
group whose seeds are not all different (two runs of seed 0, or two of unknown seed) is not a
set of seeds: each of its runs is a row of its own. Every row is labelled by its algorithm as a
paper names it (``FedHCA²``, :data:`ALGORITHM_NAMES`); rows that would share a label get what
tells them apart, the least that does: the config fields they differ in (``FedAvg (lr=0.2)``),
else their directory names, else the directories as given. The baseline row comes first, the
others in command-line order.

Columns. Each is labelled by its dataset (``NYUD``; a client's name where one dataset has two
clients of a task), task, metric and arrow: ``NYUD semseg mIoU ↑`` (:func:`column_labels`).
LaTeX puts the dataset on a header line of its own above ``semseg mIoU ↑`` and the best mean
of each column in bold (:func:`render_latex`); CSV keeps machine names (:func:`render_csv`).

Numbers. Each metric cell is the mean over the method's seeds ± their sample standard
deviation (ddof = 1; one seed shows no ±). Δm (``fedmtl.metrics.delta_m``) is computed per
seed against the baseline run of the same seed, then averaged (mean ± std of the paired Δm,
not the Δm of the mean metrics). Its terms (:func:`run_delta_m`, ``--delta_m``): ``cells``
(the default, the paper's 2C/4C tables) one per (dataset, task), the metric first averaged
over the clients holding it, in the run and in the baseline alike; ``columns`` one per
(client, task) column. The two are equal where each (dataset, task) has one client. The
baseline is the Local run(s) unless ``--baseline`` names a run directory or a row label; a
method with a seed the baseline lacks is an error, as is a baseline term of 0 (Δm undefined;
with cells, a cell whose clients all score 0).

Cost. ``MB/round`` is the mean over the rounds of the bytes all clients sent and received in
one (10^6 bytes), ``GB total`` the whole run's (10^9 bytes), each the mean over the method's
seeds, from results.json's ``communication`` (docs/evaluation.md, "Communication cost"). A
run without it (written before fedmtl counted the cost) leaves both cells empty; one resumed
from a checkpoint without it counts only its later rounds, so its ``GB total`` stays empty.

Privacy. Where any run compared has a ``privacy`` block in results.json (a run with
``privacy.mode`` set), the table has a column ``ε (δ)`` beside Δm: the (ε, δ) guarantee the
run's accountant spent, ``3.21 (1e-05)``; ``∞`` for a run of noise multiplier 0 (no
guarantee); ``—`` for a run without privacy. The seeds of a row share its privacy setting, so
the row shows the largest ε and δ of its runs (the weakest guarantee), not their mean; a run
without privacy in a row of private runs makes it ``∞``. Where the private rows differ in mode
(central, local, sample: client-level against sample-level guarantees), each cell names its
mode. Without any privacy block the table is as before (:func:`row_privacy`).

"separated". A rough screen, not a significance test: ``yes`` when the method was run with at
least two seeds and |mean paired Δm| exceeds the standard deviation of its paired Δm across
seeds (equivalently, the paired t statistic exceeds √n); ``no`` when it does not; ``n/a`` with
one seed (no spread to compare with); ``baseline`` on the baseline row.

Curves. A panel per column, one of Δm against the paired baseline run and one of the
training loss (the mean over clients); a method with several seeds is its mean in a band of ±
their standard deviation; the baseline is dashed everywhere (:func:`draw_curves`).

Outputs follow the command line's rule for user files: an existing ``--output``,
``--curves`` or ``--partition`` file is refused unless ``--overwrite true``. Table math (:func:`compute_table`,
:func:`delta_m_series`) is pure; loading, rendering and drawing are separate functions, which
``notebooks/compare_methods.ipynb`` uses too.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMATS = ("markdown", "csv", "latex")
# What Δm averages over (run_delta_m): the default first.
DELTA_M_AVERAGES = ("cells", "columns")
# How a paper names them; anything not here is shown as fedmtl names it.
ALGORITHM_NAMES = {"FedHCA2": "FedHCA²", "MaTFL": "MaT-FL"}
DATASET_NAMES = {"pascal_context": "PASCAL-Context", "nyud": "NYUD", "cityscapes": "Cityscapes"}
UNITS = {"mIoU": "%", "maxF": "%", "odsF": "%", "mErr": "°", "RMSE": "m"}  # fedmtl.metrics' scales
CURVE_SUFFIXES = (".png", ".svg")
BASELINE_ALGORITHM = "Local"
# Decimals of a metric as `fedmtl fit` prints them (cli.format_results): RMSE is in metres.
DECIMALS = {"RMSE": 4}


# ---------------------------------------------------------------------------- what a report holds


@dataclass(frozen=True)
class Column:
    """One client task: its metric and which way is better."""

    client: str
    task: str
    metric: str
    lower_is_better: bool
    dataset: str = ""  # as results.json names it (pascal_context, nyud); "" : not known

    @property
    def key(self) -> str:
        return f"{self.client}/{self.task}"

    @property
    def arrow(self) -> str:
        return "↓" if self.lower_is_better else "↑"

    @property
    def csv_name(self) -> str:
        return f"{self.key}_{self.metric}"  # as metrics.csv names it after "val/"

    @property
    def unit(self) -> str:
        return UNITS.get(self.metric, "")

    @property
    def heading(self) -> str:
        """The lower line of a two-level header: ``semseg mIoU ↑``."""
        return f"{self.task} {self.metric} {self.arrow}"


@dataclass(frozen=True)
class Cost:
    """A run's communication as results.json records it: all clients' bytes up and down over
    the rounds counted (fewer than the run's after a resume from a checkpoint that predates
    the count)."""

    bytes: int
    rounds: int


@dataclass(frozen=True)
class Privacy:
    """The (ε, δ) guarantee a run spent, as results.json's ``privacy`` records it."""

    mode: str  # central, local, sample
    epsilon: float  # math.inf: noise multiplier 0 (results.json's null), no guarantee
    delta: float


@dataclass(frozen=True)
class Run:
    """A finished run directory, as results.json (and config.yaml) describe it."""

    path: Path  # as given on the command line
    algorithm: str
    seed: int | None  # None: neither results.json nor config.yaml says
    scenario: Mapping[str, tuple[str, tuple[str, ...]]]  # client -> (dataset, tasks)
    columns: tuple[Column, ...]
    metrics: Mapping[str, float]  # Column.key -> final value
    config_key: str  # equal for runs whose configs differ only in the seed
    rounds: int | None = None  # the run's last round (results.json); None: not recorded
    cost: Cost | None = None  # None: results.json does not record it
    # What changes a metric's number (fedmtl.federated.scoring); an option not known is absent
    scoring: Mapping[str, Any] = field(default_factory=dict)
    # config.yaml flattened (a.b: value), without the seed and the resumable fields: what tells
    # two rows of one algorithm apart
    settings: Mapping[str, Any] = field(default_factory=dict)
    privacy: Privacy | None = None  # None: run without privacy (or written before it was recorded)

    @property
    def name(self) -> str:
        return self.path.resolve().name


@dataclass(frozen=True)
class RunGroup:
    """The runs behind one table row (one "method" of the report): one run, or the runs of one
    config with different seeds (sorted by seed)."""

    label: str
    runs: tuple[Run, ...]

    @property
    def algorithm(self) -> str:
        return self.runs[0].algorithm

    @property
    def seeds(self) -> list[int | None]:
        return [run.seed for run in self.runs]


@dataclass(frozen=True)
class Report:
    columns: tuple[Column, ...]
    methods: tuple[RunGroup, ...]  # the baseline first
    baseline: RunGroup | None  # None: none was needed and none could be chosen (build_report)
    delta_m: str = DELTA_M_AVERAGES[0]  # what Δm averages over (run_delta_m)


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (None for a single value) of ``n`` values."""

    mean: float
    std: float | None
    n: int


@dataclass(frozen=True)
class Row:
    label: str
    algorithm: str
    seeds: tuple[int | None, ...]
    metrics: Mapping[str, Stat]  # Column.key -> over seeds
    delta_m: Stat  # of the paired per-seed Δm
    separated: str  # yes / no / n/a / baseline
    mb_per_round: float | None = None  # mean over seeds; None: a run lacks the cost
    gb_total: float | None = None
    runs: tuple[str, ...] = ()  # the run directories, as given
    privacy: Privacy | None = None  # the weakest of its runs' (row_privacy); None: none has privacy


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    baseline: str  # its label

    @property
    def private(self) -> bool:
        """Whether the table has the ε (δ) column: a row has privacy."""
        return any(row.privacy is not None for row in self.rows)

    @property
    def privacy_modes(self) -> set[str]:
        return {row.privacy.mode for row in self.rows if row.privacy is not None}


# ---------------------------------------------------------------------------- loading runs


def load_run(path: str | Path, held_out: bool = False) -> Run:
    """A finished run directory; raises naming the directory when it is missing or unfinished.
    ``held_out``: the run as its held-out clients saw it (results.json's ``held_out``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run directory")
    if not path.is_dir():
        raise ValueError(f"{path} is a file: give run directories (each holds results.json)")
    config = _read_config(path)
    results = _read_results(path, config)
    clients = _held_out_clients(path, results) if held_out else results["clients"]
    columns = _columns(path, clients)
    metrics = _final_metrics(path, clients, columns)
    return Run(
        path=path,
        algorithm=str(results.get("algorithm", "?")),
        seed=results.get("seed", config.get("seed")),
        scenario={client: (info["dataset"], tuple(info["tasks"])) for client, info in clients.items()},
        columns=columns,
        metrics=metrics,
        config_key=_config_key(config, results),
        rounds=results["rounds"] if isinstance(results.get("rounds"), int) else None,
        cost=_cost(path, results),
        scoring=_scoring(path, config, results),
        settings=_settings(config),
        privacy=_privacy(path, results),
    )


def _privacy(path: Path, results: Mapping[str, Any]) -> Privacy | None:
    """results.json's ``privacy``: None for a run without privacy (null, or no key in a run
    written before fedmtl had it); a block fedmtl could not have written is refused."""
    block = results.get("privacy")
    if block is None:
        return None
    epsilon = block.get("epsilon") if isinstance(block, dict) else None
    delta = block.get("delta") if isinstance(block, dict) else None
    mode = block.get("mode") if isinstance(block, dict) else None

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

    if not (
        mode in ("central", "local", "sample")
        and (epsilon is None or (number(epsilon) and epsilon >= 0))
        and number(delta)
        and 0 < delta < 1
    ):
        raise ValueError(
            f"{path / 'results.json'}: its privacy has no mode (central, local or sample), epsilon (a "
            "number >= 0, or null) and delta in (0, 1): the file was changed after the run wrote it; "
            "restore it, or leave the run out"
        )
    return Privacy(mode, math.inf if epsilon is None else float(epsilon), float(delta))


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    from fedmtl.federated.rundir import flatten, is_resumable

    return {k: v for k, v in flatten(config).items() if k != "seed" and not is_resumable(k)} if config else {}


def _scoring(path: Path, config: Mapping[str, Any], results: Mapping[str, Any]) -> Mapping[str, Any]:
    """How the run was scored: results.json's ``scoring``, or for a run written before it was
    recorded, what its config.yaml and data fingerprint say."""
    from fedmtl.federated import scoring

    recorded = results.get("scoring")
    if isinstance(recorded, dict):
        return recorded
    held = results.get("held_out")
    everyone = [
        *results["clients"].values(),
        *(
            held["clients"].values()
            if isinstance(held, dict) and isinstance(held.get("clients"), dict)
            else ()
        ),
    ]
    scenario = [(info.get("dataset"), info.get("tasks") or ()) for info in everyone if isinstance(info, dict)]
    return scoring.from_run_files(config, scenario, scoring.read_fingerprint(path))


def _cost(path: Path, results: Mapping[str, Any]) -> Cost | None:
    """results.json's communication cost; None when it has none (a run from before it was counted)."""
    counted = results.get("communication")
    if counted is None:
        return None
    numbers = [
        counted.get(key) if isinstance(counted, dict) else None
        for key in ("up_bytes", "down_bytes", "rounds")
    ]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        raise ValueError(
            f"{path / 'results.json'}: its communication has no whole up_bytes, down_bytes and rounds >= 0: "
            "the file was changed after the run wrote it; restore it, or leave the run out"
        )
    up, down, rounds = numbers
    return Cost(up + down, rounds)


def _read_config(path: Path) -> dict[str, Any]:
    import yaml

    file = path / "config.yaml"
    if not file.is_file():
        return {}
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{file} is not valid YAML ({str(err).splitlines()[0]})") from None
    return config if isinstance(config, dict) else {}


def _read_results(path: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    file = path / "results.json"
    if not file.is_file():
        resume = f" (continue it: fedmtl fit --config {path / 'config.yaml'} --resume true)" if config else ""
        raise ValueError(f"{path} has no results.json: the run has not finished{resume}")
    try:
        results = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON ({err})") from None
    if not isinstance(results, dict) or not isinstance(results.get("clients"), dict):
        raise ValueError(f'{file} is not a fedmtl results file: it has no "clients"')
    return results


def _held_out_clients(path: Path, results: Mapping[str, Any]) -> Mapping[str, Any]:
    section = results.get("held_out")
    if not isinstance(section, dict) or not isinstance(section.get("clients"), dict):
        raise ValueError(
            f"{path} has no held-out clients (clients[].held_out in its config): report it without --held_out"
        )
    return section["clients"]


def _columns(path: Path, clients: Mapping[str, Any]) -> tuple[Column, ...]:
    from fedmtl.tasks import TASKS

    columns = []
    for client, info in clients.items():
        for task in info["tasks"]:
            if task not in TASKS:
                raise ValueError(f"{path / 'results.json'}: unknown task {task!r} of client {client}")
            (metric,) = info["metrics"][task]
            columns.append(
                Column(client, task, metric, TASKS.get(task).lower_is_better, str(info["dataset"]))
            )
    return tuple(columns)


def _final_metrics(path: Path, clients: Mapping[str, Any], columns: Sequence[Column]) -> dict[str, float]:
    """Every column's final value, a finite number. The engine writes a number, or null for a
    model that was not finite (an explicit refusal: nothing to report); anything else (a
    string, NaN, Infinity, true) was not written by fedmtl and is refused, never printed."""
    values = {c.key: clients[c.client]["metrics"][c.task][c.metric] for c in columns}
    missing = [key for key, value in values.items() if value is None]
    if missing:
        raise ValueError(
            f"{path / 'results.json'} has null metrics ({', '.join(missing)}): the evaluated model "
            "was not finite or the run was not evaluated, so it has nothing to report"
        )
    for column in columns:
        value = values[column.key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(
                f"run {path}: results.json has {column.key} {column.metric} = {value!r}, not a finite number "
                "(fedmtl writes a number, or null for a model that was not finite): the file was changed "
                "after the run wrote it; restore it, or leave the run out"
            )
    return {key: float(value) for key, value in values.items()}


def _config_key(config: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """Equal for two runs exactly when their configs differ only in the seed and in where and
    how they ran; without config.yaml, in algorithm, evaluated model and rounds."""
    from fedmtl.federated.rundir import flatten, is_resumable

    if not config:
        return json.dumps(
            ["results.json", results.get("algorithm"), results.get("evaluated"), results.get("rounds")]
        )
    fields = {k: v for k, v in flatten(config).items() if k != "seed" and not is_resumable(k)}
    return json.dumps(sorted(fields.items()), default=str)


def load_runs(paths: Iterable[str | Path], held_out: bool = False) -> list[Run]:
    """Every run once (a directory given twice is read once), all of the same scenario
    (``held_out``: their held-out clients, :func:`load_run`)."""
    runs: list[Run] = []
    seen: set[Path] = set()
    for path in paths:
        if Path(path).resolve() in seen:
            continue
        runs.append(load_run(path, held_out))
        seen.add(runs[-1].path.resolve())
    check_same_scenario(runs)
    check_same_scoring(runs)
    return runs


def check_same_scoring(runs: Sequence[Run]) -> None:
    """Raise unless every run was scored the same way: a metric under another evaluation
    option, padding or validation split is another number, and Δm across them means nothing.
    An option a run does not record (written before it was recorded) is not compared."""
    from fedmtl.federated.scoring import first_difference, shown

    for k, first in enumerate(runs):
        for other in runs[k + 1 :]:
            differs = first_difference(first.scoring, other.scoring)
            if differs is not None:
                option, mine, theirs = differs
                raise ValueError(
                    f"{first.path} and {other.path} were scored differently: {option} {shown(mine)} vs "
                    f"{shown(theirs)}; compare runs scored the same way"
                )


def check_same_scenario(runs: Sequence[Run]) -> None:
    """Raise unless every run has the same clients, datasets and tasks (Δm needs the same columns)."""
    first = runs[0]
    for other in runs[1:]:
        if other.scenario == first.scenario:
            continue
        mine = {f"{c}/{t} ({d})" for c, (d, tasks) in first.scenario.items() for t in tasks}
        theirs = {f"{c}/{t} ({d})" for c, (d, tasks) in other.scenario.items() for t in tasks}
        raise ValueError(
            f"{first.path} and {other.path} are runs of different scenarios: only in {first.path}: "
            f"{_few(mine - theirs)}; only in {other.path}: {_few(theirs - mine)}"
        )


def _few(items: Iterable[str], shown: int = 4) -> str:
    items = sorted(items)
    if not items:
        return "nothing"
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


# ---------------------------------------------------------------------------- rows and the baseline


def group_runs(runs: Sequence[Run]) -> list[RunGroup]:
    """Runs of one config with distinct seeds form one method; any other run is its own."""
    by_config: dict[str, list[Run]] = {}
    for run in runs:
        by_config.setdefault(run.config_key, []).append(run)
    methods = []
    for same in by_config.values():
        seeds = [run.seed for run in same]
        if len(same) > 1 and len(set(seeds)) == len(seeds):
            ordered = sorted(same, key=lambda r: (r.seed is not None, r.seed or 0))
            methods.append(RunGroup(display_name(same[0].algorithm), tuple(ordered)))
        else:
            methods.extend(RunGroup(display_name(run.algorithm), (run,)) for run in same)
    return _with_unique_labels(methods)


def display_name(algorithm: str) -> str:
    """The method as a paper names it (``FedHCA2`` -> ``FedHCA²``)."""
    return ALGORITHM_NAMES.get(algorithm, algorithm)


def _with_unique_labels(methods: list[RunGroup]) -> list[RunGroup]:
    """Rows that share a label get, after it, what tells them apart, the least that does: the
    config fields their runs differ in (``FedAvg (lr=0.2)``), else their directory names, else
    the directories as given."""
    out = list(methods)
    for label in dict.fromkeys(m.label for m in methods):
        same = [k for k, m in enumerate(methods) if m.label == label]
        if len(same) == 1:
            continue
        groups = [methods[k] for k in same]
        suffixes = next(
            (
                texts
                for texts in (
                    _differing_settings(groups),
                    [", ".join(r.name for r in g.runs) for g in groups],
                )
                if texts is not None and len(set(texts)) == len(texts)
            ),
            [", ".join(str(r.path) for r in g.runs) for g in groups],
        )
        for k, suffix in zip(same, suffixes, strict=True):
            out[k] = RunGroup(f"{label} ({suffix})", methods[k].runs)
    return out


def _differing_settings(groups: Sequence[RunGroup], shown: int = 2) -> list[str] | None:
    """Per group, the config fields (their last dotted part) in which the groups' first runs
    differ, ``name=value``, at most ``shown`` of them (algorithm options first)."""
    settings = [g.runs[0].settings for g in groups]
    if not all(settings):
        return None
    keys = sorted(
        {k for s in settings for k in s if len({json.dumps(s.get(k), default=str) for s in settings}) > 1},
        key=lambda k: (not k.startswith("algorithm."), k),
    )[:shown]
    if not keys:
        return None
    return [", ".join(f"{k.rsplit('.', 1)[-1]}={_setting_text(s.get(k))}" for k in keys) for s in settings]


def _setting_text(value: Any) -> str:
    return "unset" if value is None else value if isinstance(value, str) else json.dumps(value, default=str)


def choose_baseline(methods: Sequence[RunGroup], baseline: str | None = None) -> RunGroup:
    """The method named by ``baseline`` (a run directory or a row label), else the Local one."""
    labels = ", ".join(m.label for m in methods)
    if baseline is None:
        local = [m for m in methods if m.algorithm == BASELINE_ALGORITHM]
        if len(local) == 1:
            return local[0]
        if not local:
            raise ValueError(
                f"no baseline: none of the runs is {BASELINE_ALGORITHM} (rows: {labels}); "
                "name one with --baseline RUN_DIR or --baseline LABEL"
            )
        raise ValueError(
            f"several {BASELINE_ALGORITHM} rows ({', '.join(m.label for m in local)}): "
            "choose the baseline with --baseline RUN_DIR or --baseline LABEL"
        )
    if Path(baseline).is_dir():
        for method in methods:
            if any(run.path.resolve() == Path(baseline).resolve() for run in method.runs):
                return method
    for method in methods:
        if method.label == baseline:
            return method
    by_algorithm = [m for m in methods if baseline in (m.algorithm, display_name(m.algorithm))]
    if len(by_algorithm) == 1:  # FedHCA2 for FedHCA², FedAvg for FedAvg (lr=0.1) when it is the only one
        return by_algorithm[0]
    raise ValueError(
        f"--baseline {baseline}: not a run directory of the report nor a row label (rows: {labels})"
    )


def build_report(
    paths: Sequence[str | Path],
    baseline: str | None = None,
    held_out: bool = False,
    need_baseline: bool = True,
    delta_m: str = DELTA_M_AVERAGES[0],
) -> Report:
    """Load, check and group the runs; a ``baseline`` directory not among ``paths`` joins them.
    ``held_out``: the table of the runs' held-out clients instead of the federation's.
    ``need_baseline`` False: where no baseline can be chosen (no Local run, or several), the
    report has none (enough for :func:`draw_partition`, not for a table or curves).
    ``delta_m``: what Δm averages over (:func:`run_delta_m`)."""
    check_delta_m(delta_m)
    paths = list(paths)
    if baseline is not None and Path(baseline).is_dir():
        paths.append(baseline)  # read once if it is already there
    if not paths:
        raise ValueError("no run directories to report on")
    runs = load_runs(paths, held_out)
    methods = group_runs(runs)
    try:
        chosen = choose_baseline(methods, baseline)
    except ValueError:
        if need_baseline or baseline is not None:
            raise
        return Report(columns=runs[0].columns, methods=tuple(methods), baseline=None, delta_m=delta_m)
    ordered = (chosen, *(m for m in methods if m is not chosen))
    return Report(columns=runs[0].columns, methods=ordered, baseline=chosen, delta_m=delta_m)


def paired_runs(method: RunGroup, baseline: RunGroup) -> list[tuple[Run, Run]]:
    """Each run of ``method`` with the baseline run of the same seed; raises when one lacks it."""
    by_seed = {run.seed: run for run in baseline.runs}
    pairs = []
    for run in method.runs:
        if run.seed not in by_seed:
            raise ValueError(
                f"baseline {baseline.label} has no run with seed {_seed_text(run.seed)} to pair with "
                f"{run.path} (baseline seeds: {', '.join(map(_seed_text, by_seed))}); Δm is paired by "
                "seed: run the baseline with that seed too, or leave the run out"
            )
        pairs.append((run, by_seed[run.seed]))
    return pairs


def _seed_text(seed: int | None) -> str:
    return "unknown" if seed is None else str(seed)


# ---------------------------------------------------------------------------- the table (pure)


def stat(values: Sequence[float]) -> Stat:
    """Mean and sample standard deviation (ddof = 1) of ``values``."""
    std = statistics.stdev(values) if len(values) > 1 else None
    return Stat(statistics.fmean(values), std, len(values))


def separated(delta: Stat) -> str:
    """Whether the paired Δm stands out of its own spread across seeds (module docstring)."""
    if delta.std is None:
        return "n/a"
    return "yes" if abs(delta.mean) > delta.std else "no"


def check_delta_m(average: str) -> str:
    """``average`` if it is one of :data:`DELTA_M_AVERAGES`; raises naming the option otherwise."""
    if average not in DELTA_M_AVERAGES:
        raise ValueError(
            f"--delta_m is {average!r}: use cells (the default: one term per (dataset, task), the "
            "clients holding it averaged first, as the paper's 2C/4C tables) or columns (one term per "
            "client task)"
        )
    return average


def delta_m_terms(columns: Sequence[Column], average: str = DELTA_M_AVERAGES[0]) -> dict[Any, list[str]]:
    """Δm's terms, each with the Column.keys averaged into it (pure). ``cells``: one per
    (dataset, task), in the order first seen; a column whose dataset is not known is a term of
    its own. ``columns``: one per column."""
    check_delta_m(average)
    terms: dict[Any, list[str]] = {}
    for c in columns:
        term = (c.dataset, c.task) if average == "cells" and c.dataset else c.key
        terms.setdefault(term, []).append(c.key)
    return terms


def run_delta_m(
    values: Mapping[str, float],
    baseline: Mapping[str, float],
    columns: Sequence[Column],
    average: str = DELTA_M_AVERAGES[0],
) -> float:
    """Δm (%) of ``values`` against ``baseline`` (each Column.key -> metric), over the terms of
    :func:`delta_m_terms`: each term's metric is the mean over its columns, in ``values`` and
    in ``baseline`` alike, then ``fedmtl.metrics.delta_m`` of the terms. The one definition
    the table and the curves use."""
    from fedmtl.metrics.delta_m import delta_m

    terms = delta_m_terms(columns, average)
    lower = {c.key for c in columns if c.lower_is_better}  # one task: all or none of a term
    mine = {t: statistics.fmean(values[k] for k in keys) for t, keys in terms.items()}
    base = {t: statistics.fmean(baseline[k] for k in keys) for t, keys in terms.items()}
    return delta_m(mine, base, {t for t, keys in terms.items() if keys[0] in lower})


def paired_delta_m(
    run: Run, base: Run, columns: Sequence[Column], average: str = DELTA_M_AVERAGES[0]
) -> float:
    return run_delta_m(run.metrics, base.metrics, columns, average)


def check_baseline_defined(
    baseline: RunGroup, columns: Sequence[Column], average: str = DELTA_M_AVERAGES[0]
) -> None:
    """Δm divides by the baseline's value of each of its terms (:func:`delta_m_terms`): a 0 (an
    mIoU of an untrained model) leaves it undefined. A cell is 0 only where all its clients are."""
    by_key = {c.key: c for c in columns}
    for run in baseline.runs:
        zero = [
            " + ".join(f"{by_key[k].key} {by_key[k].metric}" for k in keys)
            for keys in delta_m_terms(columns, average).values()
            if statistics.fmean(run.metrics[k] for k in keys) == 0
        ]
        if zero:
            raise ValueError(
                f"Δm is undefined against baseline {baseline.label}: {run.path} has {_few(zero)} = 0 "
                "(Δm is relative to the baseline's value); choose another --baseline"
            )


def cost_cells(runs: Sequence[Run]) -> tuple[float | None, float | None]:
    """(MB per round, GB in total) of a method, each the mean over its runs: None where a run
    lacks the cost (for GB, also where it counted fewer rounds than it ran)."""
    costs = [run.cost for run in runs]
    if any(cost is None or cost.rounds == 0 for cost in costs):
        return None, None
    per_round = statistics.fmean(cost.bytes / cost.rounds for cost in costs) / 1e6
    whole = all(cost.rounds == run.rounds for cost, run in zip(costs, runs, strict=True))
    total = statistics.fmean(cost.bytes for cost in costs) / 1e9 if whole else None
    return per_round, total


def row_privacy(runs: Sequence[Run]) -> Privacy | None:
    """A row's privacy (pure): None when no run has any; else the largest ε and δ of its runs
    (seeds share the setting: the weakest guarantee, not a mean), a run without privacy
    counting as ε = ∞. The mode is the runs' own, or ``mixed``."""
    private = [run.privacy for run in runs if run.privacy is not None]
    if not private:
        return None
    epsilon = math.inf if len(private) < len(runs) else max(p.epsilon for p in private)
    modes = {p.mode for p in private}
    return Privacy(modes.pop() if len(modes) == 1 else "mixed", epsilon, max(p.delta for p in private))


def compute_table(report: Report) -> Table:
    """Mean ± std of every metric over each method's seeds, and the paired Δm (module docstring)."""
    if report.baseline is None:
        raise ValueError("no baseline: name one with --baseline RUN_DIR or --baseline LABEL")
    check_baseline_defined(report.baseline, report.columns, report.delta_m)
    rows = []
    for method in report.methods:
        pairs = paired_runs(method, report.baseline)
        delta = stat([paired_delta_m(run, base, report.columns, report.delta_m) for run, base in pairs])
        cost = cost_cells(method.runs)
        rows.append(
            Row(
                label=method.label,
                algorithm=method.algorithm,
                seeds=tuple(method.seeds),
                metrics={c.key: stat([run.metrics[c.key] for run in method.runs]) for c in report.columns},
                delta_m=delta,
                separated="baseline" if method is report.baseline else separated(delta),
                mb_per_round=cost[0],
                gb_total=cost[1],
                runs=tuple(str(run.path) for run in method.runs),
                privacy=row_privacy(method.runs),
            )
        )
    return Table(report.columns, tuple(rows), report.baseline.label)


# ---------------------------------------------------------------------------- rendering


def format_for(output: str | Path | None) -> str:
    """The format an output file's suffix implies (.csv, .tex), else markdown."""
    suffix = Path(output).suffix.lower() if output else ""
    return {".csv": "csv", ".tex": "latex"}.get(suffix, "markdown")


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt}: unknown table format; choose one of {', '.join(FORMATS)}")
    return fmt


def render(table: Table, fmt: str, caption: str | None = None, label: str | None = None) -> str:
    """The table as ``fmt`` (markdown, csv, latex); ``caption`` and ``label`` are the LaTeX
    table's (:func:`render_latex`), unused by the other formats."""
    check_format(fmt)
    if fmt == "latex":
        return render_latex(table, caption=caption, label=label)
    return {"markdown": render_markdown, "csv": render_csv}[fmt](table)


def _number(value: float, metric: str) -> str:
    return f"{value:.{DECIMALS.get(metric, 2)}f}"


def _cell(value: Stat, metric: str, plus_minus: str) -> str:
    text = _number(value.mean, metric)
    return text if value.std is None else f"{text}{plus_minus}{_number(value.std, metric)}"


def _cost_cells(row: Row) -> list[str]:
    return ["" if v is None else f"{v:.{d}f}" for v, d in ((row.mb_per_round, 1), (row.gb_total, 2))]


COST_HEADERS = ("MB/round", "GB total")  # the cost cells' headers, after Δm
PRIVACY_HEADER = "ε (δ)"  # right after Δm, in a table with a private row


def privacy_cell(privacy: Privacy | None, with_mode: bool = False, latex: bool = False) -> str:
    """``3.21 (1e-05)``; ``∞`` for noise multiplier 0; ``—`` without privacy; ``with_mode``
    (the rows differ in mode) appends ``, central``. ``latex``: as LaTeX."""
    if privacy is None:
        return "---" if latex else "—"
    if math.isinf(privacy.epsilon):
        text = r"$\infty$" if latex else "∞"
    else:
        delta = _latex_power(privacy.delta) if latex else f"{privacy.delta:g}"
        text = f"{privacy.epsilon:.2f} ({delta})"
    return f"{text}, {privacy.mode}" if with_mode else text


def _latex_power(value: float) -> str:
    r"""``1e-05`` as ``$10^{-5}$``, ``2.5e-06`` as ``$2.5 \times 10^{-6}$``, 0.001 as is."""
    mantissa, _, exponent = f"{value:g}".partition("e")
    if not exponent:
        return mantissa
    power = f"10^{{{int(exponent)}}}"
    return f"${power}$" if mantissa == "1" else rf"${mantissa} \times {power}$"


def _privacy_cells(table: Table, row: Row, latex: bool = False) -> list[str]:
    """The ε (δ) cell where the table has the column (:attr:`Table.private`), else none."""
    if not table.private:
        return []
    return [privacy_cell(row.privacy, len(table.privacy_modes) > 1, latex)]


def column_groups(columns: Sequence[Column]) -> list[str]:
    """The upper line of the two-level header, per column: the dataset as a paper names it
    (``NYUD``), or the client's name where one dataset has two clients of one task (the
    dataset alone would not tell their columns apart)."""
    tasks_of: dict[str, list[str]] = {}
    for c in columns:
        tasks_of.setdefault(c.dataset or c.client, []).append(c.task)
    shared = {d for d, tasks in tasks_of.items() if len(set(tasks)) < len(tasks)}
    return [c.client if (c.dataset or c.client) in shared else _dataset_name(c) for c in columns]


def _dataset_name(column: Column) -> str:
    return DATASET_NAMES.get(column.dataset, column.dataset) if column.dataset else column.client


def column_labels(columns: Sequence[Column]) -> list[str]:
    """One-line headers: ``NYUD semseg mIoU ↑`` (:func:`column_groups`, then the task, its
    metric and which way is better)."""
    return [f"{group} {c.heading}" for group, c in zip(column_groups(columns), columns, strict=True)]


def best_rows(table: Table) -> dict[str, set[int]]:
    """Per metric column (Column.key) and for Δm (``"Δm"``), the rows holding the best mean as
    it is printed (ties all count): the highest, or the lowest for a ↓ metric."""
    best: dict[str, set[int]] = {}
    wanted = [(c.key, c.metric, c.lower_is_better) for c in table.columns] + [("Δm", "Δm", False)]
    for key, metric, lower in wanted:
        shown = [
            float(_number((row.delta_m if key == "Δm" else row.metrics[key]).mean, metric))
            for row in table.rows
        ]
        top = min(shown) if lower else max(shown)
        best[key] = {k for k, value in enumerate(shown) if value == top}
    return best


def render_markdown(table: Table) -> str:
    privacy = [PRIVACY_HEADER] if table.private else []
    header = [
        "method",
        "seeds",
        *column_labels(table.columns),
        "Δm (%) ↑",
        *privacy,
        *COST_HEADERS,
        "separated",
    ]
    align = [
        "---",
        "---:",
        *("---:" for _ in table.columns),
        "---:",
        *("---:" for _ in privacy),
        "---:",
        "---:",
        "---",
    ]
    body = (
        [
            row.label.replace("|", r"\|"),  # a "|" in a label would split the cell
            str(len(row.seeds)),
            *(_cell(row.metrics[c.key], c.metric, " ± ") for c in table.columns),
            _cell(row.delta_m, "Δm", " ± "),
            *_privacy_cells(table, row),
            *_cost_cells(row),
            row.separated,
        ]
        for row in table.rows
    )
    lines = [header, align, *body]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


DEFAULT_LABEL = "tab:fedmtl-report"


def default_caption(table: Table) -> str:
    """What the LaTeX table's caption says unless ``--caption`` does (LaTeX)."""
    seeds = sorted({len(row.seeds) for row in table.rows})
    over = f"over {seeds[0]} seeds" if seeds != [1] and len(seeds) == 1 else "over the seeds"
    spread = "" if seeds == [1] else rf" (mean $\pm$ standard deviation {over})"
    privacy = (
        r"; $\varepsilon$ ($\delta$) the differential privacy spent (the largest over the seeds)"
        if table.private
        else ""
    )
    return (
        f"Per-task metrics of each method{spread} and $\\Delta_m$ (\\%) against "
        f"{_latex(table.baseline)}{privacy}; the best value of each column in bold."
    )


def latex_document(table: str, *preamble: str) -> str:
    """A document that compiles on its own around ``table`` (:func:`render_latex`'s text):
    booktabs, then ``preamble`` lines (a page geometry wide enough for many columns)."""
    head = [r"\documentclass{article}", *preamble, r"\usepackage{booktabs}", r"\pagestyle{empty}"]
    return "\n".join([*head, r"\begin{document}", table, r"\end{document}", ""])


def render_latex(table: Table, caption: str | None = None, label: str | None = None) -> str:
    """A booktabs ``table``: the caption (LaTeX, as given) and label above a two-level header,
    dataset (or client, :func:`column_groups`) over ``task metric arrow``; the best mean of
    each metric column and of Δm in bold (:func:`best_rows`); mean ± std over seeds. The
    "separated" screen stays in the markdown and CSV: it is no result to print."""
    groups = column_groups(table.columns)
    first = 2  # method, seeds: the metric columns start at the third
    spans: list[tuple[str, int, int]] = []  # (group, first column, last column), 1-based
    for k, group in enumerate(groups):
        col = first + k + 1
        if spans and spans[-1][0] == group and spans[-1][2] == col - 1:
            spans[-1] = (group, spans[-1][1], col)
        else:
            spans.append((group, col, col))
    trailing = 4 if table.private else 3  # Δm, ε (δ) where a row has privacy, MB/round, GB total
    upper = ["", ""]
    for group, start, end in spans:
        upper.append(rf"\multicolumn{{{end - start + 1}}}{{c}}{{{_latex(group)}}}")
    upper += [""] * trailing
    rules = " ".join(rf"\cmidrule(lr){{{start}-{end}}}" for _, start, end in spans)
    lower = [
        "Method",
        "Seeds",
        *(f"{_latex(c.task)} {_latex(c.metric)} {_LATEX_ARROWS[c.lower_is_better]}" for c in table.columns),
        r"$\Delta_m$ (\%) $\uparrow$",
        *([r"$\varepsilon$ ($\delta$)"] if table.private else []),
        *COST_HEADERS,
    ]
    best = best_rows(table)

    def cell(value: Stat, metric: str, bold: bool) -> str:
        mean = _number(value.mean, metric).replace("-", "$-$")  # a minus, not a hyphen
        mean = rf"\textbf{{{mean}}}" if bold else mean
        return mean if value.std is None else rf"{mean} $\pm$ {_number(value.std, metric)}"

    body = [
        [
            _latex(row.label),
            str(len(row.seeds)),
            *(cell(row.metrics[c.key], c.metric, k in best[c.key]) for c in table.columns),
            cell(row.delta_m, "Δm", k in best["Δm"]),
            *_privacy_cells(table, row, latex=True),
            *_cost_cells(row),
        ]
        for k, row in enumerate(table.rows)
    ]
    spec = "lr" + "r" * len(table.columns) + "r" * trailing
    return "\n".join(
        [
            r"% fedmtl report; needs \usepackage{booktabs} in the preamble",
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{caption if caption is not None else default_caption(table)}}}",
            rf"\label{{{label if label is not None else DEFAULT_LABEL}}}",
            rf"\begin{{tabular}}{{{spec}}}",
            r"\toprule",
            " & ".join(upper) + r" \\",
            rules,
            " & ".join(lower) + r" \\",
            r"\midrule",
            *(" & ".join(cells) + r" \\" for cells in body),
            r"\bottomrule",
            r"\end{tabular}",
            r"\end{table}",
            "",
        ]
    )


_LATEX_ARROWS = {False: r"$\uparrow$", True: r"$\downarrow$"}  # by lower_is_better
_LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "\\": r"\textbackslash{}",
    "²": r"\textsuperscript{2}",  # FedHCA²: pdflatex's utf8 input does not map it everywhere
}


def _latex(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def render_csv(table: Table) -> str:
    """One row per method, full precision: method (the row's label, as in the markdown and
    LaTeX), algorithm, n_seeds, seeds, delta_m, delta_m_std, mb_per_round, gb_total (empty
    without the cost), epsilon, delta and privacy_mode (only where a row has privacy: the raw
    ε, ``inf`` for noise multiplier 0, empty for a row without privacy), separated, then ``<client>/<task>_<metric>`` and its ``_std`` per
    column (the names metrics.csv uses), then runs (the run directories, space-separated)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    names = [name for c in table.columns for name in (c.csv_name, f"{c.csv_name}_std")]
    writer.writerow(
        [
            "method",
            "algorithm",
            "n_seeds",
            "seeds",
            "delta_m",
            "delta_m_std",
            "mb_per_round",
            "gb_total",
            *(("epsilon", "delta", "privacy_mode") if table.private else ()),
            "separated",
            *names,
            "runs",
        ]
    )
    for row in table.rows:
        values = [v for c in table.columns for v in (row.metrics[c.key].mean, row.metrics[c.key].std)]
        writer.writerow(
            [
                row.label,
                row.algorithm,
                len(row.seeds),
                " ".join(map(_seed_text, row.seeds)),
                row.delta_m.mean,
                "" if row.delta_m.std is None else row.delta_m.std,
                "" if row.mb_per_round is None else row.mb_per_round,
                "" if row.gb_total is None else row.gb_total,
                *_privacy_csv(table, row),
                row.separated,
                *("" if v is None else v for v in values),
                " ".join(row.runs),
            ]
        )
    return out.getvalue()


def _privacy_csv(table: Table, row: Row) -> list[Any]:
    if not table.private:
        return []
    if row.privacy is None:
        return ["", "", ""]
    return [row.privacy.epsilon, row.privacy.delta, row.privacy.mode]


# ---------------------------------------------------------------------------- curves over rounds

History = Mapping[int, Mapping[str, float]]  # round -> Column.key -> value


def read_history(run: Run, columns: Sequence[Column]) -> dict[int, dict[str, float]]:
    """The evaluated model's metrics of every evaluation round, from the run's metrics.csv.

    The whole file must read, up to the run's last round: a file cut short (a full disk, an
    interrupted copy) or edited is one error naming the run, the file and the line, never
    curves drawn from part of it. A value that is not finite is kept as it is (the engine
    writes ``nan`` for a model that was not finite at that round) and left out of the curves."""
    file = run.path / "metrics.csv"
    wanted = {f"val/{c.csv_name}": c.key for c in columns}  # engine: val/<client>/<task>_<metric>
    history: dict[int, dict[str, float]] = {}
    for round_, key, value in _metrics_rows(run):
        if key in wanted:
            history.setdefault(round_, {})[wanted[key]] = value
    if run.rounds is not None and set(history.get(run.rounds, {})) != set(wanted.values()):
        ends = f"its last evaluation is round {max(history)}" if history else "it holds no evaluation"
        raise ValueError(
            f"run {run.path}: {file} lacks the metrics of round {run.rounds}, the run's last ({ends}): "
            f"the file is incomplete, {_CURVES_FIX}"
        )
    return history


def read_losses(run: Run) -> dict[int, float]:
    """The training loss of every round, the mean over the clients that trained in it (the
    ``train/<client>/loss`` keys of metrics.csv; a value that is not finite is left out)."""
    by_round: dict[int, list[float]] = {}
    for round_, key, value in _metrics_rows(run):
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "train" and parts[2] == "loss" and math.isfinite(value):
            by_round.setdefault(round_, []).append(value)
    return {r: statistics.fmean(values) for r, values in sorted(by_round.items())}


_CURVES_FIX = "so --curves cannot draw this run; leave the run out, or leave --curves out"


def _metrics_rows(run: Run) -> list[tuple[int, str, float]]:
    """Every (round, key, value) of the run's metrics.csv; raises naming the line that does not read."""
    file = run.path / "metrics.csv"
    if not file.is_file():
        raise ValueError(f"{run.path} has no metrics.csv: no curves to draw for it")
    fix = _CURVES_FIX
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"run {run.path}: {file} cannot be read ({err}), {fix}") from None
    if text and not text.endswith("\n"):  # every row the engine writes ends its line
        last = text.splitlines()[-1]
        raise ValueError(
            f"run {run.path}: {file} is truncated: its last line, {last[:60]!r}, is incomplete, {fix}"
        )
    rows = []
    reader = csv.reader(io.StringIO(text))
    for row in reader:
        if reader.line_num == 1:
            if row != ["round", "key", "value"]:
                raise ValueError(f"run {run.path}: {file} does not start with round,key,value, {fix}")
            continue
        try:
            round_, key, value = int(row[0]), row[1], float(row[2])
            if len(row) != 3:
                raise ValueError
        except (ValueError, IndexError):
            shown = ",".join(row)[:80]
            raise ValueError(
                f"run {run.path}: {file} line {reader.line_num}, {shown!r}, is not round,key,value "
                f"(a whole round number, a name and a number), {fix}"
            ) from None
        rows.append((round_, key, value))
    return rows


def metric_series(history: History, key: str) -> tuple[list[int], list[float]]:
    """The rounds with a finite value of ``key``, and the values."""
    rounds = sorted(r for r in history if key in history[r] and math.isfinite(history[r][key]))
    return rounds, [history[r][key] for r in rounds]


def delta_m_series(
    history: History, baseline: History, columns: Sequence[Column], average: str = DELTA_M_AVERAGES[0]
) -> tuple[list[int], list[float]]:
    """Δm (:func:`run_delta_m`) per round where both runs evaluated every column, finite, and
    Δm is defined (no baseline term of 0, as :func:`check_baseline_defined`)."""
    keys = {c.key for c in columns}
    terms = list(delta_m_terms(columns, average).values())
    rounds, values = [], []
    for r in sorted(set(history) & set(baseline)):
        mine, base = history[r], baseline[r]
        if not (keys <= mine.keys() and keys <= base.keys()):
            continue
        finite = all(math.isfinite(mine[k]) and math.isfinite(base[k]) for k in keys)
        if finite and all(statistics.fmean(base[k] for k in term) != 0 for term in terms):
            rounds.append(r)
            values.append(run_delta_m(mine, base, columns, average))
    return rounds, values


def mean_band(
    series: Sequence[tuple[Sequence[int], Sequence[float]]],
) -> tuple[list[int], list[float], list[float] | None]:
    """Over seeds: the rounds every seed has a value at, the mean there, and the sample
    standard deviation (ddof = 1, as the table's ±; None with one seed)."""
    if len(series) == 1:
        rounds, values = series[0]
        return list(rounds), list(values), None
    common = sorted(set.intersection(*(set(rounds) for rounds, _ in series)))
    at = [dict(zip(rounds, values, strict=True)) for rounds, values in series]
    means = [statistics.fmean(seed[r] for seed in at) for r in common]
    stds = [statistics.stdev(seed[r] for seed in at) for r in common]
    return common, means, stds


def _plot_band(ax, series, **style) -> None:
    """The mean over seeds as a line and, with two seeds or more, a ± std band around it."""
    rounds, means, stds = mean_band(series)
    ax.plot(rounds, means, marker=".", **style)
    if stds is not None and rounds:
        low = [m - s for m, s in zip(means, stds, strict=True)]
        high = [m + s for m, s in zip(means, stds, strict=True)]
        ax.fill_between(rounds, low, high, color=style["color"], alpha=0.2, linewidth=0)


def draw_curves(report: Report):
    """A matplotlib Figure (Agg canvas, no pyplot): a panel per client task with its metric
    over the rounds, one of Δm over the rounds against the paired baseline run, and one of the
    training loss (the mean over clients). Each method is its mean over seeds, a line, with a
    band of ± the seeds' standard deviation; the baseline is dashed everywhere (its Δm is the
    line at 0); one legend for the figure names each method once."""
    from matplotlib.lines import Line2D

    columns = report.columns
    runs = [run for m in report.methods for run in m.runs]
    histories = {run.path: read_history(run, columns) for run in runs}
    losses = {run.path: read_losses(run) for run in runs}
    fig, metric_axes, delta_ax, loss_ax = _panels(len(columns))
    base = report.baseline

    def style(method: RunGroup) -> dict[str, str]:
        k = report.methods.index(method)
        return {"color": f"C{k % 10}", "linestyle": "--" if method is base else "-"}

    for method in report.methods:
        for ax, column in zip(metric_axes, columns, strict=True):
            _plot_band(
                ax, [metric_series(histories[r.path], column.key) for r in method.runs], **style(method)
            )
        loss = [(list(losses[r.path]), list(losses[r.path].values())) for r in method.runs]
        _plot_band(loss_ax, loss, **style(method))
        if method is not base:
            delta = [
                delta_m_series(histories[run.path], histories[paired.path], columns, report.delta_m)
                for run, paired in paired_runs(method, base)
            ]
            _plot_band(delta_ax, delta, **style(method))
    delta_ax.axhline(0.0, **style(base))
    for ax, column, label in zip(metric_axes, columns, column_labels(columns), strict=True):
        ax.set_title(label, fontsize=9)
        ax.set_ylabel(f"{column.metric} ({column.unit})" if column.unit else column.metric, fontsize=8)
    delta_ax.set_title(f"Δm ↑ vs {base.label}", fontsize=9)
    delta_ax.set_ylabel("Δm (%)", fontsize=8)
    loss_ax.set_title("training loss (mean over clients)", fontsize=9)
    loss_ax.set_ylabel("loss", fontsize=8)
    if not any(losses.values()):  # runs written before metrics.csv held the loss
        loss_ax.text(
            0.5, 0.5, "no training loss recorded", ha="center", va="center", transform=loss_ax.transAxes
        )
    seeds = "mean ± std over seeds" if any(len(m.runs) > 1 for m in report.methods) else None
    handles = [
        Line2D([], [], marker=".", label=m.label + (" (baseline)" if m is base else ""), **style(m))
        for m in report.methods
    ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(len(handles), 5),
        fontsize=8,
        title=seeds,
        title_fontsize=8,
    )
    return fig


def _panels(metrics: int):
    """A figure with ``metrics`` panels, one for Δm and one for the loss, three to a row, the
    x axis in whole rounds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = metrics + 2
    ncols = min(3, panels)
    nrows = math.ceil(panels / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.0 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)  # off-screen: no display needed
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    for ax in axes[:panels]:
        ax.set_xlabel("round", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
    return fig, axes[:metrics], axes[metrics], axes[metrics + 1]


# ---------------------------------------------------------------------------- partitions


def partition_of(run: Run) -> dict[str, tuple[str, dict[str, int]]]:
    """Each client's dataset and images per dominant class, from the run's results.json;
    raises naming the run when it does not record them."""
    clients = _read_results(run.path, {})["clients"]
    missing = [name for name, info in clients.items() if info.get("class_histogram") is None]
    if missing:
        raise ValueError(
            f"{run.path}/results.json records no class_histogram for {_few(missing)} (a run written "
            "before fedmtl recorded partitions, or data without semseg labels), so --partition cannot "
            "draw it; leave the run out, or leave --partition out"
        )
    return {name: (info["dataset"], dict(info["class_histogram"])) for name, info in clients.items()}


def distinct_partitions(runs: Sequence[Run]) -> list[tuple[list[Run], dict[str, tuple[str, dict[str, int]]]]]:
    """The runs' partitions, each once, with the runs that share it (the methods of one seed)."""
    out: list[tuple[list[Run], dict[str, tuple[str, dict[str, int]]]]] = []
    for run in runs:
        partition = partition_of(run)
        same = next((entry for entry in out if entry[1] == partition), None)
        if same is None:
            out.append(([run], partition))
        else:
            same[0].append(run)
    return out


def draw_partition(report: Report):
    """A matplotlib Figure: per partition (the runs that share one) and dataset, a panel of
    stacked bars, one bar per client, its images per dominant class."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = [run for method in report.methods for run in method.runs]
    panels = [
        (sharing, dataset, {c: h for c, (d, h) in partition.items() if d == dataset})
        for sharing, partition in distinct_partitions(runs)
        for dataset in sorted({d for d, _ in partition.values()})
    ]
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(7.5 * ncols, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)  # off-screen: no display needed
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, (sharing, dataset, histograms) in zip(axes, panels, strict=False):
        _stacked_bars(ax, histograms)
        names = ", ".join(run.name for run in sharing[:3]) + (", ..." if len(sharing) > 3 else "")
        seed = sharing[0].seed
        ax.set_title(f"{dataset}, seed {_seed_text(seed)} ({names})", fontsize=9)
    return fig


def _stacked_bars(ax, histograms: Mapping[str, Mapping[str, int]]) -> None:
    """One bar per client, a segment per dominant class (the order of the first client that has it)."""
    classes = list(dict.fromkeys(c for histogram in histograms.values() for c in histogram))
    clients = list(histograms)
    bottom = [0] * len(clients)
    # tab20 tells 20 classes apart (PASCAL-Context's foreground); past it, colours repeat.
    from matplotlib import colormaps

    palette = colormaps["tab20"].colors
    colours = [palette[i % len(palette)] for i in range(len(classes))]
    for cls, colour in zip(classes, colours, strict=True):
        heights = [histograms[client].get(cls, 0) for client in clients]
        ax.bar(range(len(clients)), heights, bottom=bottom, color=colour, label=cls, width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(range(len(clients)), clients, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("training images", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(
        fontsize=6,
        ncols=2 if len(classes) > 8 else 1,
        title="dominant class",
        title_fontsize=6,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),  # beside the bars, never over them
    )


# ---------------------------------------------------------------------------- writing files


def check_outputs(
    output: str | Path | None, curves: str | Path | None, overwrite: bool, partition: str | Path | None = None
) -> None:
    """Raise unless the table file ``output`` and the figures ``curves`` and ``partition`` (any
    may be None) can be written: a folder that exists, a figure suffix matplotlib writes,
    different files, and no existing file unless ``overwrite`` (the command line's rule for a
    user's files)."""
    files = {"--output": output, "--curves": curves, "--partition": partition}
    files = {option: path for option, path in files.items() if path is not None}
    for option in ("--curves", "--partition"):
        if option in files and Path(files[option]).suffix.lower() not in CURVE_SUFFIXES:
            raise ValueError(
                f"{option} {files[option]}: the file name must end in {' or '.join(CURVE_SUFFIXES)}"
            )
    seen: dict[Path, str] = {}
    for option, path in files.items():
        other = seen.setdefault(Path(path).resolve(), option)
        if other != option:
            raise ValueError(f"{other} and {option} name the same file, {path}")
    for option, path in files.items():
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"{option} {path} is a directory: give a file name")
        if path.exists() and not overwrite:
            raise ValueError(
                f"{option} {path} exists and was left as it is: choose another file, or add --overwrite true"
            )
        if not path.parent.is_dir():
            raise FileNotFoundError(f"{option} {path}: folder {path.parent} does not exist")


def write_text(path: str | Path, text: str, overwrite: bool) -> None:
    """``path`` holds ``text`` whole, or is as it was (written to a hidden temporary name and
    renamed: a full disk, a file-size limit or a kill never leaves a part of it). Without
    ``overwrite`` a file that appeared after the checks is never replaced."""
    from fedmtl.files import replace_file

    data = text.encode("utf-8")
    replace_file(path, lambda f: f.write(data), overwrite=overwrite)


def write_figure(path: str | Path, figure, overwrite: bool) -> None:
    """``figure`` to ``path`` (.png or .svg), as :func:`write_text` writes a table."""
    from fedmtl.files import replace_file

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    replace_file(path, lambda f: figure.savefig(f, format=fmt, dpi=120), overwrite=overwrite)
