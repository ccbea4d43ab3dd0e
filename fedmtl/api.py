"""The Python API: :func:`fit` trains a scenario and :func:`compare` tabulates finished runs,
as ``fedmtl fit`` and ``fedmtl report`` do, with the same checks.

    import fedmtl

    summary = fedmtl.fit("configs/demo.yaml", run_dir="runs/demo", rounds=2)
    print(fedmtl.compare(["runs/demo"]))

:func:`fit` runs the CLI's own code (:func:`fedmtl.cli.fit_namespace`): the whole config is
checked before anything is written, RUN_DIR/config.yaml is written exactly as ``fedmtl fit``
writes it (so ``fedmtl validate --run_dir`` works on the run), a run directory that already
holds files is refused unless ``resume=True`` or ``overwrite=True``, and synthetic data is
generated on first use. A refusal raises the exception whose message the CLI prints after
``error:`` (ValueError, FileNotFoundError, KeyError), never ``sys.exit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: A scenario config: a YAML file's path (or a bundled config's name) or its content.
Config = str | Path | Mapping[str, Any]


def fit(config: Config | Sequence[Config], **overrides: Any) -> dict[str, Any] | None:
    """Train a scenario, as ``fedmtl fit --config CONFIG --FIELD VALUE ...`` does.

    Args:
        config: a scenario YAML file (a path, or a bundled config's name as ``fedmtl configs``
            lists it), or the same content as a dict; or a list of them, each over the one
            before, as repeated ``--config`` options (``["configs/scenario1.yaml",
            "configs/methods/fedavg.yaml"]``).
        **overrides: fields of :class:`fedmtl.config.RunConfig` replacing the config's, as
            on the command line: ``run_dir="runs/x"``, ``rounds=3``, ``resume=True``; a nested
            field as a dict (``evaluation={"every": 2}``, merged into the config's) or a dotted
            name (``**{"evaluation.every": 2}``).

    Returns:
        The results summary (the content of RUN_DIR/results.json) on global rank 0, None on
        the other ranks of a multi-process run. A finished run given ``resume=True`` returns
        its results without training.

    Raises:
        ValueError: a bad config value, a run directory that holds another run, a resume
            whose config differs from the run's: the CLI's message.
        FileNotFoundError: a missing config file, data or checkpoint.
    """
    from fedmtl.cli import _is_leader, fit_namespace
    from fedmtl.federated import stopping

    parser = _parser()
    cfg_ns = _namespace(parser, config, overrides)
    with stopping.handling(_is_leader()):  # SIGTERM / SIGINT stop at a safe point: stopping.Stopped
        return fit_namespace(parser, cfg_ns)


def compare(
    runs: Sequence[str | Path],
    baseline: str | None = None,
    held_out: bool = False,
    format: str | None = None,  # noqa: A002 - the CLI's --format
    output: str | Path | None = None,
    curves: str | Path | None = None,
    partition: str | Path | None = None,
    overwrite: bool = False,
    caption: str | None = None,
    label: str | None = None,
    delta_m: str = "cells",
) -> str | None:
    """The table ``fedmtl report RUNS`` prints: each method's metrics (mean ± std over seeds)
    and Δm against ``baseline`` (default: the Local run), with ε (δ) beside Δm where a run
    has privacy (the largest over a row's seeds; ``fedmtl.report`` docstring), in ``format`` (markdown, csv or
    latex; default: by ``output``'s suffix, else markdown; LaTeX with ``caption`` and
    ``label``). ``output``, ``curves`` (metrics over the rounds, .png or .svg) and
    ``partition`` (each client's images per dominant class) also write files; an existing one
    is refused unless ``overwrite``. Every output is checked before any is written.
    ``delta_m``: what Δm averages over: ``cells`` (one term per (dataset, task), the clients
    holding it averaged first, as the paper's 2C/4C tables) or ``columns`` (one per client
    task); the same where each (dataset, task) has one client.

    Returns None, writing only the partition, when the partition alone is asked for and the
    runs have no baseline (one run, or runs without Local): there is no table to make."""
    from fedmtl import report

    fmt = report.check_format(format or report.format_for(output))
    report.check_delta_m(delta_m)
    report.check_outputs(output, curves, overwrite, partition)
    if held_out and curves is not None:
        raise ValueError(
            "--curves draws the federation's rounds, and held-out clients are evaluated once, after the "
            "last: leave out --curves with --held_out true"
        )
    # Asked for the partition alone, the runs need no baseline: the table is left out where
    # none can be chosen (one run's partition, runs without Local), and made where it can.
    alone = partition is not None and all(value is None for value in (output, curves, format, baseline))
    built = report.build_report(
        list(runs), baseline=baseline, held_out=held_out, need_baseline=not alone, delta_m=delta_m
    )
    if built.baseline is None:
        report.write_figure(partition, report.draw_partition(built), overwrite)
        return None
    text = report.render(report.compute_table(built), fmt, caption=caption, label=label)
    figure = report.draw_curves(built) if curves is not None else None
    drawn = report.draw_partition(built) if partition is not None else None
    if output is not None:
        report.write_text(output, text, overwrite)
    if figure is not None:
        report.write_figure(curves, figure, overwrite)
    if drawn is not None:
        report.write_figure(partition, drawn, overwrite)
    return text


def _parser() -> Any:
    """``fedmtl fit``'s parser, raising on a bad value instead of exiting."""
    from fedmtl.cli import _run_parser

    parser = _run_parser()
    parser.exit_on_error = False
    return parser


def _namespace(parser: Any, config: Config | Sequence[Config], overrides: Mapping[str, Any]) -> Any:
    """The parsed config (as ``fedmtl fit`` has it, without ``config``): each file or mapping
    over the one before, as repeated ``--config`` options layer, then ``overrides``. The
    parser's refusals become ValueError with its message."""
    from jsonargparse import ArgumentError

    layers = list(config) if isinstance(config, list | tuple) else [config]
    try:
        cfg_ns = parser.get_defaults()
        for layer in layers:
            cfg_ns = parser.parse_object(_content(layer), cfg_base=cfg_ns, defaults=False)
        cfg_ns = parser.parse_object(_nested(overrides), cfg_base=cfg_ns)  # checks the whole config
    except ArgumentError as err:
        raise ValueError(" ".join(str(err).split())) from None
    cfg_ns.pop("config", None)
    return cfg_ns


def _content(config: Config) -> Mapping[str, Any]:
    """A config layer's fields: a file's (checked as ``--config`` checks it), or the mapping."""
    from fedmtl.cli import _check_config_files
    from fedmtl.config import read_yaml

    if isinstance(config, Mapping):
        return config
    if not isinstance(config, str | Path):
        raise ValueError(
            f"config is a {type(config).__name__}: fedmtl.fit takes a scenario YAML file's path, a dict, "
            "or a list of them (layered as repeated --config options)"
        )
    path = Path(_check_config_files(["--config", str(config)])[1])  # a bundled name; YAML errors named
    return read_yaml(path.read_text(), path)


def _nested(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"evaluation.every": 2}`` as ``{"evaluation": {"every": 2}}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *parents, name = key.split(".")
        target = out
        for parent in parents:
            target = target.setdefault(parent, {})
        target[name] = _merge(target.get(name), value) if isinstance(value, Mapping) else value
    return out


def _merge(base: Any, changes: Any) -> Any:
    """``changes`` over ``base``: mappings merged key by key, anything else replaced."""
    if not isinstance(base, Mapping) or not isinstance(changes, Mapping):
        return changes
    out = dict(base)
    for key, value in changes.items():
        out[key] = _merge(out.get(key), value)
    return out
