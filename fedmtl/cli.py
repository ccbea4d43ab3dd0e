"""The ``fedmtl`` command line.

    fedmtl fit --config configs/demo.yaml                    # train; RUN_DIR/results.json at the end
    fedmtl fit --config configs/scenario1.yaml --devices 2 --run_dir runs/s1
    fedmtl fit --config configs/demo.yaml --resume true      # continue from the latest checkpoint
    fedmtl fit --config configs/demo.yaml --overwrite true   # replace the run already in run_dir
    fedmtl fit --config configs/demo.yaml --print_config     # the full resolved config
    fedmtl validate --run_dir runs/demo                      # evaluate a run's latest checkpoint
    fedmtl data synth --dataset nyud --root data/NYUDv2      # a synthetic dataset in the real layout
    fedmtl configs                                           # the bundled configs; --config NAME finds them
    fedmtl data check --root data                            # the datasets a data root holds, file by file
    fedmtl data prepare PASCALContext.tar.gz NYUDv2.tar.gz --root data   # unpack the downloaded archives
    fedmtl report runs/local runs/fedavg runs/fedhca2        # the methods' metrics and Δm vs Local, a table
    fedmtl report runs/* --format latex --output table.tex --curves curves.png   # files (never overwritten)

Every field of the scenario config (``fedmtl.config.RunConfig``) can be set in the YAML file
or on the command line (``--rounds 3``, ``--evaluation.every 2``, ``--algorithm FedAvg``).
Every bad input (a config value, a missing or corrupt file, an impossible machine setting, a
run directory that already holds a run) prints one ``error:`` line naming it and the fix and
exits non-zero, before anything is written (``fedmtl.federated.preflight``, ``rundir``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile, Namespace
from jsonargparse import ArgumentParser as _ArgumentParser

from fedmtl.terminal import interactive


class ArgumentParser(_ArgumentParser):
    """jsonargparse's parser whose errors are one ``error:`` line (no usage dump); an unknown
    ``--algorithm`` lists the known methods."""

    def error(self, message: str, ex: Exception | None = None):
        if 'Parser key "algorithm"' in message:
            message = _method_error(message)
        elif 'Parser key "data.partition"' in message:
            message = _partition_error(message)
        if not self.exit_on_error:  # a parent parser reports it
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        print(f"error: {' '.join(message.split())} (all options: {prog} --help)", file=sys.stderr)
        sys.exit(2)


def _method_error(message: str) -> str:
    """jsonargparse's error about ``algorithm``, with the names it may take. An unknown name
    (of the algorithm, or of FedDEA's ``algorithm.host``) is said in one phrase: jsonargparse
    lists every way it tried to read it."""
    from fedmtl.methods import METHODS

    known = f"known methods: {', '.join(METHODS.names())}"
    name = re.search(r"import path string: (\S+)", message)
    if name is None:
        return f"{message.rstrip()}; {known}"
    key = ".".join(re.findall(r'Parser key "(\w+)"', message))  # algorithm, or algorithm.host
    if key == "algorithm.host":
        from fedmtl.methods.feddea import HOSTS

        known = f"FedDEA's hosts: {', '.join(HOSTS)}"
    return f'Parser key "{key}": no method named {name.group(1)!r}; {known}'


def _partition_error(message: str) -> str:
    """jsonargparse's error about ``data.partition``, an unknown name said in one phrase with
    the names it may take."""
    from fedmtl.data.partition import PARTITIONERS

    known = f"known partitions: {', '.join(PARTITIONERS.names())}"
    name = re.search(r"import path string: (\S+)", message)
    if name is None:  # a known partition with an option of the wrong type: jsonargparse says it
        return message
    return f'Parser key "data.partition": no partition named {name.group(1)!r}; {known}'


def _check_config_files(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config NAME`` (or ``--config=NAME``) as a path to an existing,
    valid YAML file: NAME itself when it is a file, else the bundled config of that relative
    name or of that (unique) base name (``fedmtl.bundled``); otherwise one line names it."""
    import yaml

    from fedmtl import bundled
    from fedmtl.config import read_yaml

    out = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            value = arg[len("--config=") :]
        elif i > 0 and argv[i - 1] == "--config":
            value = arg
        else:
            continue
        path = Path(value)
        if path.is_dir():
            raise ValueError(
                f"config file {value} is a directory, not a file: --config takes a scenario YAML file "
                "(`fedmtl configs` lists the bundled ones)"
            )
        if not path.is_file():
            name = bundled.find(value)
            if name is None:
                raise FileNotFoundError(
                    f"config file {value} not found: no such file and no bundled config of that name "
                    "(`fedmtl configs` lists them; --config takes a scenario YAML file)"
                )
            path = Path(bundled.path(name))
        out[i] = f"--config={path}" if arg.startswith("--config=") else str(path)
        try:
            content = read_yaml(path.read_text(), path)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"config file {path}: YAML syntax error{where}: {problem}") from None
        except UnicodeDecodeError:
            raise ValueError(f"config file {path} is not a text file: {_CONFIG_SHAPE}") from None
        except OSError as err:
            raise ValueError(f"config file {path} cannot be read ({err.strerror or err})") from None
        if not isinstance(content, dict):
            # jsonargparse's own words for these ("Unexpected config: - a") name neither the file nor the fix
            what = "is empty" if content is None else f"holds a YAML {_yaml_kind(content)}, not a config"
            raise ValueError(f"config file {path} {what}: {_CONFIG_SHAPE}")
    return out


#: What a config file looks like, for the errors about one that does not.
_CONFIG_SHAPE = (
    "a scenario config is a YAML mapping of fields, e.g. `rounds: 10` and `clients: [{dataset: nyud, "
    "tasks: [depth]}]` on lines of their own (`fedmtl configs show demo.yaml` prints a whole one)"
)


def _yaml_kind(content: Any) -> str:
    return "list" if isinstance(content, list) else f"single value ({content!r:.40})"


def _add_configs_command(commands: Any) -> None:
    """``fedmtl configs`` lists the bundled configs; ``fedmtl configs show NAME`` prints one."""
    parser = ArgumentParser(description="The scenario configs that ship with fedmtl (--config NAME).")
    commands.add_subcommand("configs", parser, help="list the bundled configs (configs show NAME prints one)")
    show = ArgumentParser(description="Print a bundled config.")
    show.add_argument("name", help="a name as `fedmtl configs` lists it, or its base name")
    parser.add_subcommands(dest="configs_command", required=False).add_subcommand(
        "show", show, help="print a bundled config"
    )


def _configs(args: Namespace) -> None:
    from fedmtl import bundled

    if args.configs_command != "show":
        names = bundled.names()
        width = max(map(len, names))
        for name in names:
            print(f"{name.ljust(width)}  {bundled.description(name)}".rstrip())
        return
    name = bundled.find(args.show.name)
    if name is None:
        raise FileNotFoundError(f"no bundled config named {args.show.name} (`fedmtl configs` lists them)")
    print(bundled.text(name), end="")


def synth(
    dataset: str,
    root: Path,
    num_train: int = 500,
    num_val: int = 200,
    size: tuple[int, int] | None = None,
    seed: int = 0,
    workers: int | None = None,
    overwrite: bool = False,
    render_scale: float = 1.0,
) -> None:
    """Write a procedurally rendered dataset in the real on-disk layout.

    Args:
        dataset: pascal_context, nyud or cityscapes.
        root: the dataset folder to write (e.g. data/PASCALContext).
        num_train: training images.
        num_val: validation images.
        size: image height and width (default: 96 x 96; Cityscapes 64 x 128, its 1:2).
        seed: the same seed writes the same files.
        workers: processes to render with (default: all cores).
        overwrite: replace ``root`` if it already holds files (refused otherwise).
        render_scale: in (0, 1]: render at this fraction of size and scale up (faster, less detail).
    """
    from fedmtl.synth import SYNTH, generate
    from fedmtl.synth.generator import check_options

    if size is None:  # the dataset's own (an unknown dataset: generate refuses it, naming the known ones)
        size = SYNTH.get(dataset).size if dataset in SYNTH.names() else (96, 96)
    check_options(num_train, num_val, size, seed, workers, prefix="--", render_scale=render_scale)  # as typed
    out = generate(
        dataset,
        root,
        num_train=num_train,
        num_val=num_val,
        size=size,
        seed=seed,
        workers=workers,
        progress=interactive(),
        overwrite=overwrite,
        render_scale=render_scale,
    )
    print(f"wrote {num_train} train + {num_val} val {dataset} images to {out}")


def _run_parser() -> ArgumentParser:
    from fedmtl.config import RunConfig

    parser = ArgumentParser(description="Train a federated scenario.", exit_on_error=True)
    parser.add_argument("--config", action=ActionConfigFile, help="scenario YAML file")
    parser.add_class_arguments(RunConfig, sub_configs=True)
    return parser


def _eval_parser() -> ArgumentParser:
    parser = ArgumentParser(description="Evaluate the latest checkpoint of a run on the validation split.")
    parser.add_argument("--run_dir", type=str, required=True, help="the run directory (holds config.yaml)")
    parser.add_argument("--devices", type=int | None, default=None, help="override the run's devices")
    parser.add_argument("--accelerator", type=str | None, default=None, help="override the run's accelerator")
    parser.add_argument(
        "--evaluation.edge_thin_gt",
        type=bool | None,
        default=None,
        help="override the run's evaluation.edge_thin_gt: score edges against the thinned ground truth "
        "(true, SEISM's) or the unthinned one (false)",
    )
    return parser


def _report_parser() -> ArgumentParser:
    parser = ArgumentParser(
        description="Compare finished runs: per client task metrics (mean ± std over seeds) and Δm "
        "against a baseline (fedmtl.report)."
    )
    parser.add_argument(
        "runs", type=str, nargs="+", metavar="RUN_DIR", help="run directories (hold results.json)"
    )
    parser.add_argument(
        "--baseline",
        type=str | None,
        default=None,
        help="a run directory or a row label (default: the Local run)",
    )
    parser.add_argument(
        "--format",
        type=str | None,
        default=None,
        help="markdown, csv or latex (default: from --output's suffix, .csv or .tex; else markdown)",
    )
    parser.add_argument(
        "--output", type=str | None, default=None, help="write the table to this file, not stdout"
    )
    parser.add_argument(
        "--caption",
        type=str | None,
        default=None,
        help="the LaTeX table's \\caption, as LaTeX (default: what the columns hold and the baseline)",
    )
    parser.add_argument(
        "--label",
        type=str | None,
        default=None,
        help="the LaTeX table's \\label (default: tab:fedmtl-report)",
    )
    parser.add_argument(
        "--curves",
        type=str | None,
        default=None,
        help="also draw metrics and Δm over the rounds to this .png or .svg",
    )
    parser.add_argument(
        "--held_out",
        type=bool,
        default=False,
        help="report the runs' held-out clients (fine-tuned after the last round) instead of the federation",
    )
    parser.add_argument(
        "--partition",
        type=str | None,
        default=None,
        help="also draw each client's training images per dominant class (results.json's "
        "class_histogram), per dataset, to this .png or .svg",
    )
    parser.add_argument(
        "--overwrite",
        type=bool,
        default=False,
        help="replace an existing --output / --curves / --partition file",
    )
    parser.add_argument(
        "--delta_m",
        type=str,
        default="cells",
        help="what Δm averages over: cells (one term per (dataset, task), the clients holding it "
        "averaged first, as the paper's 2C/4C tables) or columns (one term per client task)",
    )
    return parser


def _report(args: Namespace) -> None:
    """The outputs are checked first and written last: an error leaves every file as it was."""
    from fedmtl import report
    from fedmtl.api import compare

    text = compare(
        args.runs, baseline=args.baseline, held_out=args.held_out, format=args.format, output=args.output,
        curves=args.curves, partition=args.partition, overwrite=args.overwrite, caption=args.caption,
        label=args.label, delta_m=args.delta_m,
    )  # fmt: skip
    if text is None:  # the partition alone, of runs without a baseline
        print(f"partition: {args.partition}")
        print(
            f"no table: no baseline among the runs (none is {report.BASELINE_ALGORITHM}, or several are); "
            "add --baseline RUN_DIR for one",
            file=sys.stderr,
        )
        return
    if args.output is None:
        print(text, end="")
    for what, path in [("table", args.output), ("curves", args.curves), ("partition", args.partition)]:
        if path is not None:
            print(f"{what}: {path}")


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fedmtl", description="Hetero-client federated multi-task learning.")
    parser.add_argument("--version", action=_VersionAction, help="print fedmtl's version and exit")
    commands = parser.add_subcommands(dest="command")
    commands.add_subcommand("fit", _run_parser(), help="train a scenario")
    commands.add_subcommand("validate", _eval_parser(), help="evaluate a run's latest checkpoint")
    commands.add_subcommand(
        "test", _eval_parser(), help="same as validate (the benchmarks' val split is their test set)"
    )
    data = ArgumentParser(description="Dataset tools.")
    commands.add_subcommand("data", data, help="dataset tools")  # jsonargparse: parent level first
    data_commands = data.add_subcommands(dest="data_command")
    synth_parser = ArgumentParser(description="Write a synthetic dataset in the real on-disk layout.")
    synth_parser.add_function_arguments(synth)
    data_commands.add_subcommand("synth", synth_parser, help="generate a synthetic dataset")
    root_help = (
        "data root holding PASCALContext/, NYUDv2/ and Cityscapes/ (default: $FEDMTL_DATA, else ./data)"
    )
    check_parser = ArgumentParser(description="Check the datasets of a data root (fedmtl.data.check).")
    check_parser.add_argument("--root", type=str | None, default=None, help=root_help)
    check_parser.add_argument(
        "--dataset",
        type=str | None,
        default=None,
        help="pascal_context, nyud or cityscapes (default: those found)",
    )
    check_parser.add_argument(
        "--sample",
        type=int,
        default=1000,
        help="images per split whose labels are decoded and their class values checked, a seeded sample "
        "(every file's header is read); 0: every image",
    )
    data_commands.add_subcommand("check", check_parser, help="check the datasets of a data root")
    prepare_parser = ArgumentParser(description="Unpack downloaded dataset archives (fedmtl.data.prepare).")
    prepare_parser.add_argument(
        "archives",
        type=str,
        nargs="+",
        metavar="ARCHIVE",
        help=".tar, .tar.gz/.tgz, .tar.bz2/.tbz2, .tar.xz/.txz or .zip files",
    )
    prepare_parser.add_argument("--root", type=str | None, default=None, help=root_help)
    data_commands.add_subcommand("prepare", prepare_parser, help="unpack dataset archives and check them")
    _add_configs_command(commands)
    commands.add_subcommand("report", _report_parser(), help="compare finished runs: a table with Δm, curves")
    return parser


def _version() -> str:
    """fedmtl's version, from the installed package's metadata."""
    from importlib import metadata

    try:
        return metadata.version("fedmtl")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: reads the package metadata only when given, not for every command."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        print(f"fedmtl {_version()}")
        parser.exit()


def _is_leader() -> bool:
    """The process that a user started (or rank 0 of a torchrun / SLURM launch). Fabric's
    own launcher re-runs the command for the other local ranks with LOCAL_RANK set."""
    return all(
        os.environ.get(v, "0") == "0" for v in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
    )


def _ensure_data(cfg: Any) -> None:
    """Generate the datasets a scenario needs when its config asks for synthetic data.

    Only the leader generates (before Fabric launches the other local processes); under
    torchrun or SLURM every process starts at once, so generate the data beforehand. Holds the
    data root while it generates: a second fit (or synth) there waits, then finds the data
    written and uses it (fedmtl.data.rootlock)."""
    from fedmtl.data import rootlock
    from fedmtl.data.datasets import DATASETS
    from fedmtl.synth import generate

    if cfg.data.synth is None or not _is_leader():
        return
    root = cfg.data.resolved_root()
    missing = [
        dataset
        for dataset in sorted({group.dataset for group in cfg.clients})
        if cfg.data.synth.get(dataset) is not None and not DATASETS.get(dataset).has_split(root, "train")
    ]
    if not missing:  # the usual case: no lock taken, nothing written
        return
    with rootlock.hold(Path(root), "data.root"):
        for dataset in missing:
            spec, s = DATASETS.get(dataset), cfg.data.synth[dataset]
            folder = Path(root) / spec.root_folder
            if spec.has_split(root, "train"):  # written while this process waited
                print(
                    f"using the synthetic {dataset} data another process wrote in {folder}", file=sys.stderr
                )
                continue
            if folder.is_dir() and any(folder.iterdir()):
                raise ValueError(
                    f"data.synth.{dataset}: {folder} holds files but no {dataset} training split, so fedmtl "
                    f"will not write synthetic data over it: move it away, or point data.root at another folder"
                )
            print(f"generating synthetic {dataset} data in {folder} (first use)", file=sys.stderr)
            generate(
                dataset,
                folder,
                num_train=s.num_train,
                num_val=s.num_val,
                size=tuple(s.size),
                seed=s.seed,
                progress=interactive(),
                render_scale=s.render_scale,
            )


def format_results(summary: dict[str, Any], source: str = "results.json") -> str:
    """The final metrics of a results summary as aligned text tables: the federation's clients,
    then the held-out clients (``summary["held_out"]``) in a section of their own. Up to
    :data:`~fedmtl.federated.live.PER_CLIENT_UP_TO` clients a row per client and task; above, a row per dataset and
    task over the clients, and a line saying that ``source`` holds each client's."""
    sections = [_results_table(summary["clients"], source)]
    held = summary.get("held_out", {}).get("clients")
    if held:
        sections.append(
            f"held-out clients ({len(held)}: fine-tuned from the federated model, never in the federation):\n"
            + _results_table(held, source)
        )
    return "\n\n".join(sections)


def _results_table(clients: dict[str, Any], source: str) -> str:
    """``{client: {"dataset", "metrics": {task: {metric: value}}}}`` as a table (see
    :func:`format_results`); each metric with its arrow: ↑ higher is better, ↓ lower."""
    from fedmtl.federated.live import PER_CLIENT_UP_TO, arrow
    from fedmtl.report import DECIMALS

    def number(metric: str, value: float | None) -> str:
        return "n/a" if value is None else f"{value:.{DECIMALS.get(metric, 2)}f}"

    values: dict[tuple[str, str, str], list[float | None]] = {}
    for client in clients.values():
        for task, metrics in client["metrics"].items():
            for metric, value in metrics.items():
                values.setdefault((client["dataset"], task, metric), []).append(value)
    note = None
    if len(clients) <= PER_CLIENT_UP_TO:
        rows = [("client", "task", "metric", "value")]
        for name, client in clients.items():
            for task, metrics in client["metrics"].items():
                for metric, value in metrics.items():
                    rows.append((name, task, f"{metric} {arrow(task)}", number(metric, value)))
    else:
        rows = [("dataset", "task", "metric", "clients", "mean", "min", "max")]
        for (dataset, task, metric), found in values.items():
            numbers = [v for v in found if v is not None]
            stats = [sum(numbers) / len(numbers), min(numbers), max(numbers)] if numbers else [None] * 3
            counted = f"{len(numbers)}" + (
                f" ({len(found) - len(numbers)} n/a)" if len(numbers) < len(found) else ""
            )
            rows.append(
                (dataset, task, f"{metric} {arrow(task)}", counted, *(number(metric, v) for v in stats))
            )
        note = f"{len(clients)} clients: per dataset and task over them; each client's metrics: {source}"
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + ([note] if note else []))


def format_server_values(values: dict[str, float]) -> str:
    """The server's logged values: FedHCA²'s α per client and β as a decoder x layer table;
    any other value on a line of its own."""
    alpha = {k[len("alpha/") :]: v for k, v in values.items() if k.startswith("alpha/")}
    beta: dict[str, dict[str, float]] = {}
    for key, value in values.items():
        if key.startswith("beta/"):
            client, task, layer = key[len("beta/") :].split("/")
            beta.setdefault(f"{client} / {task}", {})[layer] = value
    lines = [f"{k}: {v:.4f}" for k, v in values.items() if not k.startswith(("alpha/", "beta/"))]
    if alpha:
        width = max(map(len, alpha))
        lines += ["alpha (encoder hyper weight per client):"]
        lines += [f"  {name.ljust(width)}  {value:.4f}" for name, value in alpha.items()]
    if beta:
        layers = list(next(iter(beta.values())))
        width = max(map(len, beta))
        lines += [
            "beta (decoder hyper weight per layer):",
            "  " + " " * width + "  " + "  ".join(f"L{i + 1:<5d}" for i in range(len(layers))),
        ]
        lines += [
            f"  {name.ljust(width)}  " + "  ".join(f"{row[layer]:.4f}" for layer in layers)
            for name, row in beta.items()
        ]
        lines += ["  layers: " + ", ".join(f"L{i + 1} = {name}" for i, name in enumerate(layers))]
    return "\n".join(lines)


def _privacy_rounds(cfg: Any, num_clients: int) -> Any:
    """``cfg`` checked against its method for privacy (one line each) and, where it stops at
    ``privacy.target_epsilon`` before its last round, with that many rounds (said once)."""
    import dataclasses

    from fedmtl.privacy.run import check_privacy, last_round_within_target

    check_privacy(cfg)
    last = last_round_within_target(cfg, num_clients)
    if last is None or last >= cfg.rounds:
        return cfg
    if _is_leader():
        print(
            f"privacy: ε would pass target_epsilon {cfg.privacy.target_epsilon} after round {last}, so the run "
            f"stops there (of rounds: {cfg.rounds}); results.json says so (privacy.stopped_at_target)",
            file=sys.stderr,
        )
    return dataclasses.replace(cfg, rounds=last)


def _instantiate(parser: ArgumentParser, cfg_ns: Namespace) -> Any:
    """The RunConfig of ``cfg_ns``. A method checks its options as ``algorithm.NAME``; FedDEA's
    host is built before FedDEA, nested, so its refusals are renamed ``algorithm.host.NAME``."""
    from fedmtl.config import RunConfig

    try:
        return RunConfig.from_namespace(parser.instantiate(cfg_ns))
    except ValueError as err:
        algorithm = cfg_ns.get("algorithm")
        option = re.match(r"algorithm\.(\w+) ", str(err))
        host_options = algorithm is not None and str(algorithm.get("class_path", "")).endswith("FedDEA")
        if host_options and option and option.group(1) not in algorithm.get("init_args", {}):
            raise ValueError(str(err).replace("algorithm.", "algorithm.host.", 1)) from None
        raise


def _check_run_dir(parser: ArgumentParser, cfg: Any, cfg_ns: Namespace) -> bool:
    """Whether ``cfg.run_dir`` can take this fit; raises (naming the fix) if it cannot. Returns
    True when the run starts fresh there (config.yaml is to be written)."""
    from fedmtl.federated import checkpoint, manifest, rundir

    run_dir = Path(cfg.run_dir)
    rundir.check_writable(run_dir)
    if not cfg.resume:
        rundir.check_fresh(run_dir, cfg.overwrite)
        if cfg.overwrite:  # refuses to replace a file no run wrote (a user's config.yaml)
            manifest.check_overwrite(run_dir, cfg.rounds, cfg.devices * cfg.num_nodes)
        return True
    folder, _ = checkpoint.resumable(run_dir)  # raises when no checkpoint is usable
    saved = run_dir / "config.yaml"
    if folder is not None:  # the checkpoint's own record first: config.yaml may be lost or edited
        from fedmtl.federated import resume_checks

        resume_checks.check_config(
            folder, cfg_ns.as_dict(), "resume", "this config", parser.get_defaults().as_dict()
        )
    if folder is None:
        held = [n for n in rundir.contents(run_dir) if n in ("results.json", "metrics.csv")]
        if held:
            raise ValueError(
                f"run_dir {run_dir} holds a run ({', '.join(held)}) but no checkpoint to resume from; "
                "nothing was changed. Start a new run with another --run_dir"
            )
        # The run starts over: never over a file no run wrote (a user's own config.yaml).
        manifest.check_overwrite(run_dir, cfg.rounds, cfg.devices * cfg.num_nodes, doing="--resume true")
        return True  # nothing was computed yet: the run starts over with this config
    if saved.is_file():
        try:
            before = rundir.read_config(parser, saved).as_dict()
        except Exception as err:  # noqa: BLE001 - any parse failure means the same thing here
            raise ValueError(
                f"{saved} cannot be read ({err}); it is the config the run was made with"
            ) from None
        changes = rundir.config_changes(before, cfg_ns.as_dict())
        if changes:
            raise ValueError(
                f"resume: this config differs from the run's ({saved}) in what the run computes: "
                f"{'; '.join(changes)}. Resume with the run's values, or start a new run with another "
                f"--run_dir (a resume may change only: {', '.join(rundir.RESUMABLE_FIELDS)})"
            )
    return False


def _fit(parser: ArgumentParser, args: Namespace) -> None:
    cfg_ns = args.clone()
    cfg_ns.pop("config", None)
    summary = fit_namespace(parser, cfg_ns)
    if summary is not None:  # global rank 0
        results = Path(cfg_ns.run_dir) / "results.json"
        print(format_results(summary, str(results)))
        print(f"results: {results}")
        if summary.get("server"):
            print(format_server_values(summary["server"]))
        for label, names in summary.get("nonfinite", {}).items():
            print(f"warning: the {label} model of {', '.join(names)} is not finite (NaN/inf): no metrics")


def fit_namespace(parser: ArgumentParser, cfg_ns: Namespace) -> dict[str, Any] | None:
    """Check the whole config of ``cfg_ns`` (the run parser's, ``config`` left out), write
    RUN_DIR/config.yaml and train: what ``fedmtl fit`` and :func:`fedmtl.fit` both do. Returns
    the results summary on global rank 0, None on the other ranks; a refusal raises."""
    import contextlib

    # Here, not at the top: the engine and the resume checks import the data and model stack,
    # which `fedmtl --help` and the other quick commands never need (tests/test_startup.py).
    from fedmtl.federated import manifest, preflight, resume_checks, rundir, runlock
    from fedmtl.federated.scenario import count_clients
    from fedmtl.federated.store import atomic_write_text  # a full disk: one line, no empty config.yaml

    rundir.check_path(cfg_ns.get("run_dir"), "fit")  # an empty run_dir, ".", ~ or / before anything else
    cfg = _instantiate(parser, cfg_ns)  # RunConfig's own checks run too
    # Everything is checked before anything is written: the run directory, the machine, the
    # method against the scenario, the data and the model.
    leader = _is_leader()
    if leader:  # the other ranks run while the leader holds the lock: they never check it
        runlock.check_free(cfg.run_dir)  # a busy run directory is named at once, not after the checks
    fresh = _check_run_dir(parser, cfg, cfg_ns) if leader else False
    preflight.check_environment(cfg)
    cfg.algorithm.check_run(cfg.rounds, count_clients(cfg))
    cfg = _privacy_rounds(cfg, count_clients(cfg))
    _ensure_data(cfg)
    # A finished run, resumed, only reprints its results: no model is built, so none is checked
    finished = None if fresh else finished_results(cfg)
    if finished is None:
        preflight.check_scenario(cfg)
    inputs = resume_checks.check_inputs(cfg, resume=not fresh) if leader else None  # checkpoint, data
    checked_fresh = fresh
    if leader and finished is None:  # once, after every check passed (a refusal stays one line),
        # before the run writes; a finished run only reprints its results
        for line in preflight.warmup_warnings(cfg):
            print(line, file=sys.stderr)
    run_dir = Path(cfg.run_dir)
    # One writer per run directory: the leader locks it (creating it), checks it again (another
    # process may have written there meanwhile), and only then writes; held until the run ends.
    with runlock.hold(run_dir, "fit") if leader else contextlib.nullcontext():
        if leader:
            fresh = _check_run_dir(parser, cfg, cfg_ns)
            if fresh != checked_fresh:  # another process published or removed a checkpoint meanwhile
                if finished is not None:
                    finished = None
                    preflight.check_scenario(cfg)
                inputs = resume_checks.check_inputs(cfg, resume=not fresh)
            ranks = cfg.devices * cfg.num_nodes
            if cfg.overwrite and not cfg.resume:
                note = manifest.clear(run_dir, cfg.rounds, ranks)  # only what the previous run wrote
                if note:
                    print(note, file=sys.stderr)
            manifest.record(run_dir, cfg.rounds, ranks)  # before the run writes any of it
            if fresh:
                atomic_write_text(run_dir / "config.yaml", parser.dump(cfg_ns, skip_none=False))
            elif not (run_dir / "config.yaml").is_file():  # lost: this config matched the checkpoint's
                restored = cfg_ns.clone()
                restored.resume = restored.overwrite = False
                atomic_write_text(run_dir / "config.yaml", parser.dump(restored, skip_none=False))
            resume_checks.record_inputs(cfg, inputs, fresh, parser)
            if cfg.logger.wandb:
                rundir.wandb_run_id(run_dir)  # before Fabric starts other processes, which read it
        if finished is not None:  # what the engine prints and returns for it, without Fabric or a model
            folder, results = finished
            if leader:
                print(f"resume: continuing after round {cfg.rounds} from {folder}", file=sys.stderr)
                print(f"resume: the run finished its {cfg.rounds} rounds; its results:", file=sys.stderr)
            return results if leader else None
        from fedmtl.federated.engine import run  # Fabric and the models: only for a run to train

        return run(cfg, config_dict=cfg_ns.as_dict())


def finished_results(cfg: Any) -> tuple[Path, dict[str, Any]] | None:
    """For a resume of a run that has finished ``cfg.rounds`` rounds, the checkpoint it would
    resume from (that round's, intact) and its results.json; None otherwise (a run to train, or
    a results.json lost or changed: the engine writes it again from the checkpoint)."""
    import json

    from fedmtl.federated import checkpoint

    run_dir = Path(cfg.run_dir)
    if not cfg.resume:
        return None
    folder, note = checkpoint.resumable(run_dir)
    if folder is None or note is not None or folder.name != checkpoint.round_name(cfg.rounds):
        return None  # the engine says why it resumes from another folder
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(results, dict) or results.get("rounds") != cfg.rounds:
        return None
    if not isinstance(results.get("clients"), dict):
        return None
    return folder, results


def _evaluate(args: Namespace, command: str) -> None:
    import contextlib

    # Here, not at the top: see _fit.
    from fedmtl.federated import manifest, resume_checks, rundir, runlock
    from fedmtl.federated.engine import evaluate_checkpoint

    rundir.check_path(args.run_dir, command)
    run_dir = Path(args.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(
            f"run_dir {run_dir} is a file, not a directory: --run_dir is the folder `fedmtl fit` wrote"
        )
    config = run_dir / "config.yaml"
    parser = _run_parser()
    if config.is_file():
        cfg_ns = rundir.read_config(parser, config)
        given = str(config)
    else:  # lost: the checkpoint records the config the run computes with
        record, folder = _recorded_config(
            run_dir, f"`fedmtl {command}`", "--run_dir must be the folder a `fedmtl fit` run wrote"
        )
        if _is_leader():  # Fabric's other local ranks run this command again
            print(
                f"{command}: {config} not found: using the config recorded in checkpoint {folder}",
                file=sys.stderr,
            )
        cfg_ns = parser.parse_object(record)
        given = None
    cfg_ns.run_dir = str(run_dir)
    if args.devices is not None:
        cfg_ns.devices = args.devices
    if args.accelerator is not None:
        cfg_ns.accelerator = args.accelerator
    if args.evaluation.edge_thin_gt is not None:
        cfg_ns.evaluation.edge_thin_gt = args.evaluation.edge_thin_gt
    cfg_ns.logger.wandb = False
    cfg = _instantiate(parser, cfg_ns)
    leader = _is_leader()
    if given is not None and leader:  # config.yaml against the checkpoint's record, before any state
        from fedmtl.federated import checkpoint

        folder, _ = checkpoint.resumable(run_dir)
        if folder is not None:
            resume_checks.check_config(
                folder, cfg_ns.as_dict(), command, given, parser.get_defaults().as_dict()
            )
    # It writes {command}_results.json (and, with store: disk, the client store): one writer.
    with runlock.hold(run_dir, command) if leader else contextlib.nullcontext():
        if leader:
            resume_checks.check_inputs(cfg, resume=True, doing=command)  # checkpoint and data are the run's
            manifest.record(run_dir, cfg.rounds, cfg.devices * cfg.num_nodes)
        summary = evaluate_checkpoint(cfg, output=run_dir / f"{command}_results.json")
        if summary is not None:  # global rank 0
            print(format_results(summary, str(run_dir / f"{command}_results.json")))


def _from_worker(message: str) -> str:
    """A DataLoader worker's error (a NaN label, a corrupt image) arrives with the worker's
    traceback in its message; its last line is the error itself."""
    if message.startswith("Caught ") and "\nOriginal Traceback" in message:
        return message.rstrip().splitlines()[-1].split(": ", 1)[-1]
    return message


def _recorded_config(run_dir: Path, doing: str, fix: str) -> tuple[dict[str, Any], Path]:
    """The config the latest checkpoint of ``run_dir`` records (what the run computes; the
    fields a resume may change are not in it) and that checkpoint; FileNotFoundError naming
    what is missing, and ``fix``, when there is none."""
    from fedmtl.federated import checkpoint

    folder, _ = checkpoint.resumable(run_dir) if run_dir.is_dir() else (None, None)
    record = checkpoint.recorded_config(folder) if folder is not None else None
    if record is None:
        held = (
            f"{run_dir} does not exist"
            if not run_dir.exists()
            else f"{run_dir} holds no config.yaml and no checkpoint"
            if folder is None
            else f"{run_dir} holds no config.yaml, and its checkpoint {folder.name} was written before "
            "fedmtl recorded the run's config there"
        )
        raise FileNotFoundError(f"{doing} needs the run's config: {held}; {fix}")
    return record, folder


def _resume_config(argv: list[str]) -> list[str]:
    """``fit --run_dir R --resume true`` without ``--config``: ``argv`` with the run's own
    config first (``R/config.yaml``, else the one its checkpoint records), so the fields the
    command line gives override it; any other ``argv`` as it is."""
    if not argv or argv[0] != "fit" or any(a == "--config" or a.startswith("--config=") for a in argv):
        return argv
    values: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for name in ("--resume", "--run_dir"):
            if arg.startswith(name + "="):
                values[name] = arg[len(name) + 1 :]
            elif arg == name and i + 1 < len(argv):
                values[name] = argv[i + 1]
    if values.get("--resume", "").lower() not in ("true", "yes") or not values.get("--run_dir"):
        return argv
    run_dir = Path(values["--run_dir"])
    saved = run_dir / "config.yaml"
    if saved.is_file():
        _check_config_files(["--config", str(saved)])  # duplicate keys, a damaged file: one line
        if _is_leader():  # Fabric's other local ranks run this command again
            print(f"resume: no --config given: using the run's {saved}", file=sys.stderr)
        return ["fit", "--config", str(saved), *argv[1:]]
    import json

    record, folder = _recorded_config(
        run_dir,
        "fit --resume true without --config",
        "pass it with --config (the scenario file the run was started with)",
    )
    if _is_leader():
        print(
            f"resume: no --config given and no {saved}: using the config recorded in {folder} (it holds what "
            "the run computes; data.root and the other fields a resume may change are as given here)",
            file=sys.stderr,
        )
    # jsonargparse reads a --config value that is not a file as the config itself (JSON is YAML)
    return ["fit", f"--config={json.dumps(record)}", *argv[1:]]


_GROUP_OPTION = re.compile(r"--clients\.(\d+)\.([A-Za-z_][\w.]*)(?:=(.*))?$", re.DOTALL)


def _client_group_options(argv: list[str]) -> list[str]:
    """``fit``'s ``--clients.N.FIELD VALUE`` (or ``=VALUE``) options applied to group N of the
    ``clients`` list: jsonargparse gives a list of dataclasses no index path (its
    ``--clients.FIELD`` edits the last entry only), so the list is resolved without them (every
    ``--config`` and ``--clients``), edited, and passed whole as a last ``--clients`` JSON, whose
    values jsonargparse then checks. A group or field that does not exist is one line."""
    if not argv or argv[0] != "fit" or not any(_GROUP_OPTION.match(a) for a in argv):
        return argv
    import json

    import yaml

    rest, edits, k = [], [], 1
    while k < len(argv):
        found = _GROUP_OPTION.match(argv[k])
        if found is None:
            rest.append(argv[k])
            k += 1
            continue
        value = found.group(3)
        if value is None:
            if k + 1 >= len(argv):
                raise ValueError(f"{argv[k]} needs a value, e.g. {argv[k]} 2")
            value, k = argv[k + 1], k + 1
        edits.append((found, value))
        k += 1
    parser = _run_parser()
    resolved = parser.parse_args([a for a in rest if not a.startswith("--print_config")])
    groups = [group.as_dict() for group in resolved.clients or []]
    for found, value in edits:
        index, path = int(found.group(1)), found.group(2)
        option = f"--clients.{index}.{path}"
        if index >= len(groups):
            raise ValueError(
                f"{option}: the config has {len(groups)} client group(s), clients.0 to "
                f"clients.{len(groups) - 1}; use one of those indices, or add a group in the YAML file"
            )
        entry, keys = groups[index], path.split(".")
        for depth, key in enumerate(keys):
            if not isinstance(entry, dict) or key not in entry:
                where = ".".join(keys[:depth]) or "a client group"
                known = ", ".join(entry) if isinstance(entry, dict) else "none"
                raise ValueError(f"{option}: {where} has no field {key!r}; its fields: {known}")
            if depth < len(keys) - 1:
                entry = entry[key]
        entry[keys[-1]] = yaml.safe_load(value)  # as jsonargparse reads a value; it checks the type
    return ["fit", *rest, f"--clients={json.dumps(groups)}"]


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # stdout's reader left (`fedmtl configs | head -3`): stop quietly, as `yes | head` does.
        # Python's "Note on SIGPIPE": point stdout at devnull so its flush at exit cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # 141: killed by SIGPIPE, the shell's code for a closed pipe


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        argv = _check_config_files(argv)
        given = argv  # as the user wrote it: the command a stopped run prints to continue
        argv = _resume_config(argv)
        argv = _client_group_options(argv)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    parser = _parser()
    args = parser.parse_args(argv)
    argv = given
    import logging

    from fedmtl.federated import stopping

    # A logging handler that cannot write (wandb's debug.log on a full disk) would print
    # "--- Logging error ---" and a traceback for every record; the error line says it once.
    logging.raiseExceptions = False
    # SIGTERM / SIGINT: a run stops at a safe point and says how to continue (stopping.py).
    with stopping.handling(_is_leader(), farewell=lambda signum: _stopped_line(args, argv, signum)):
        return _command(args, argv)


def _check_data(args: Namespace) -> None:
    from fedmtl.data.check import check_command

    check_command(args.root, args.dataset, progress=interactive(), sample=args.sample)


def _prepare_data(args: Namespace) -> None:
    from fedmtl.data.prepare import prepare_command

    prepare_command(args.archives, args.root, progress=interactive())


#: ``fedmtl data SUBCOMMAND``: its handler, given the subcommand's own options.
_DATA_COMMANDS: dict[str, Callable[[Namespace], None]] = {
    "synth": lambda args: synth(**args.as_dict()),
    "check": _check_data,
    "prepare": _prepare_data,
}

#: ``fedmtl COMMAND``: its handler, given the command's own options. A handler imports what
#: it needs when it runs, so `fedmtl --help` and the quick commands stay light.
_COMMANDS: dict[str, Callable[[Namespace], None]] = {
    "fit": lambda args: _fit(_run_parser(), args),
    "validate": lambda args: _evaluate(args, "validate"),
    "test": lambda args: _evaluate(args, "test"),
    "data": lambda args: _DATA_COMMANDS[args.data_command](args[args.data_command]),
    "configs": _configs,
    "report": _report,
}


def _command(args: Namespace, argv: list[str]) -> int:
    """Run the parsed command: 0, or a non-zero exit after one line saying why."""
    from fedmtl.federated import stopping

    try:
        _COMMANDS[args.command](args[args.command])
    except (FileNotFoundError, ValueError, KeyError) as err:
        from fedmtl.federated.health import RunStopped

        message = err.args[0] if isinstance(err, KeyError) and err.args else _from_worker(str(err))
        if _is_leader() or not isinstance(err, RunStopped):  # every rank stops; one says why
            print(f"error: {message}", file=sys.stderr)
        return 1
    except stopping.Stopped as stop:
        if _is_leader():  # every rank stops at the same point; one says how to continue
            print(_stopped_line(args, argv, stop.signum, stop), file=sys.stderr)
        return stop.exit_code
    except stopping.PeerFailed:
        return 1  # the rank that failed said why
    except BrokenPipeError:
        raise  # stdout closed early: main stops quietly
    except (OSError, RuntimeError) as err:
        from fedmtl.files import os_failure

        # Permissions, a read-only or full disk, a file-size or open-file limit, a link loop, a
        # file in the path: the system's refusal (perhaps inside torch's or pathlib's error).
        failure = os_failure(err)
        if failure is None:
            raise
        print(f"error: {_write_failed_line(args, argv, failure)}", file=sys.stderr)
        return 1
    return 0


def _continue_with(args: Namespace, argv: list[str]) -> tuple[str, str]:
    """What a stopped or failed ``fit`` left, and the command that continues it: ``--resume
    true`` from the latest complete checkpoint, or ``--overwrite true`` when the run has none
    (a resume refuses a run that logged rounds it cannot restore)."""
    import contextlib
    import shlex

    from fedmtl.federated import checkpoint

    run_dir = Path(args.fit.run_dir)
    folder = checkpoint.latest(run_dir)
    if folder is None:  # a damaged ``latest``: the complete folder a resume falls back to
        with contextlib.suppress(ValueError, OSError):
            folder, _ = checkpoint.resumable(run_dir)
    kept = []  # argv without --resume / --overwrite (and their values)
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--resume", "--overwrite"):
            skip = True
        elif not arg.startswith(("--resume=", "--overwrite=")):
            kept.append(arg)
    if not any(a == "--run_dir" or a.startswith("--run_dir=") for a in kept):
        kept += ["--run_dir", str(run_dir)]
    if folder is not None:
        command = shlex.join(["fedmtl", *kept, "--resume", "true"])
        return f"checkpoint {folder.name} is complete", f"continue with: {command}"
    started = run_dir.is_dir() and any(run_dir.iterdir())
    command = shlex.join(["fedmtl", *kept, *(["--overwrite", "true"] if started else [])])
    return "no checkpoint was written", f"start again with: {command}"


def _stopped_line(args: Namespace, argv: list[str], signum: int, stop: Any = None) -> str:
    """The one line a stopped command prints; ``stop`` None: a second signal, exiting now."""
    from fedmtl.federated.stopping import signal_name

    name = signal_name(signum)
    if stop is None:
        head = f"stopped by {name}, a second signal: exiting now, not at a safe point"
    elif stop.round is None:
        head = f"stopped by {name}"
    elif stop.finished:
        head = f"stopped by {name} after round {stop.round} of {args.fit.rounds}"
    else:
        head = f"stopped by {name} during round {stop.round} of {args.fit.rounds} (not saved)"
    if args.command != "fit":
        return head
    state, action = _continue_with(args, argv)
    return f"{head}; {state}; {action}"


def _write_failed_line(args: Namespace, argv: list[str], err: OSError) -> str:
    """An operating-system failure (a full disk, a quota, an I/O error, a read-only disk,
    permissions, a limit: ``files.OS_FIXES``) as one line: the file, the cause, the fix and,
    for ``fit``, what was kept and how to continue."""
    from fedmtl.files import describe_write_error, os_fix

    if args.command != "fit":
        return f"{describe_write_error(err)}; {os_fix(err)}, then run the command again"
    line = describe_write_error(err, where=Path(args.fit.run_dir))
    try:
        state, action = _continue_with(args, argv)
    except OSError:  # the run directory itself cannot be read (its permissions, the same limit)
        return f"{line}: {os_fix(err)}, then run the command again"
    return f"{line}. Nothing partial was kept and {state}: {os_fix(err)}, then {action}"


if __name__ == "__main__":
    sys.exit(main())
