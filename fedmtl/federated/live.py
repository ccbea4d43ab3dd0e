"""The live view of a run in a terminal: the rounds bar, what the round is doing, the running
training loss and the last evaluation's metrics, as Lightning's progress bar shows them.

Rank 0 on a terminal only (:func:`fedmtl.terminal.interactive`); elsewhere the run gets
:class:`Quiet`, whose hooks do nothing, and logs keep their one line per round
(``engine.progress_line``). The view is a few tqdm bars one above the other: the rounds bar
(its postfix: the phase), then status lines (tqdm's ``{desc}``-only bars) for the loss and the
metrics. Each status line is one dataset, its tasks summarised over the clients as mean
[min, max] ×count past :data:`PER_CLIENT_UP_TO` clients, and cut to the terminal's width, so
the view stays the same few lines at a thousand clients. The formatting functions are pure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from tqdm.auto import tqdm

#: Up to this many clients a group's value is its clients' mean alone; above, with its
#: [min, max] and count. ``engine.progress_line`` names each client up to as many, and fit's
#: final table (``cli.format_results``) lists each one's metrics.
PER_CLIENT_UP_TO = 8
#: The most status lines a section (loss, metrics) takes: datasets beyond share the last.
LINES_PER_SECTION = 3
Groups = dict[tuple[str, str], list[float]]  # {(dataset, what): the clients' values}


# ---------------------------------------------------------------------------- pure formatting


def loss_groups(values: Mapping[str, float], datasets: Mapping[str, str]) -> Groups:
    """A round's ``train/<client>/<task>_loss`` values per (dataset, task); other keys (the
    total loss, a penalty, learning rates, anything added later) are not the view's."""
    groups: Groups = {}
    for key, value in values.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "train" and parts[2].endswith("_loss") and parts[1] in datasets:
            groups.setdefault((datasets[parts[1]], parts[2][: -len("_loss")]), []).append(value)
    return groups


def metric_groups(values: Mapping[str, float], datasets: Mapping[str, str]) -> Groups:
    """An evaluation's ``val/<client>/<task>_<metric>`` values (the reported model's) per
    (dataset, "task metric arrow"), the arrow saying which way is better."""
    groups: Groups = {}
    for key, value in values.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "val" and parts[1] in datasets and "_" in parts[2]:
            task, metric = parts[2].rsplit("_", 1)
            groups.setdefault((datasets[parts[1]], f"{task} {metric}{arrow(task)}"), []).append(value)
    return groups


def arrow(task: str) -> str:
    """↑ or ↓: which way ``task``'s metric is better, as ``fedmtl report`` marks it."""
    from fedmtl.report import Column
    from fedmtl.tasks import TASKS

    if task not in TASKS:
        return ""
    return Column("", task, "", TASKS.get(task).lower_is_better).arrow


def summarised(numbers: list[float], clients: int) -> str:
    """A group's value: the mean; past :data:`PER_CLIENT_UP_TO` clients in the run, with its
    [min, max] and how many clients it counts."""
    mean = sum(numbers) / len(numbers)
    if clients <= PER_CLIENT_UP_TO or len(numbers) == 1:
        return f"{mean:.4g}"
    return f"{mean:.4g} [{min(numbers):.4g}, {max(numbers):.4g}] ×{len(numbers)}"


def section_lines(title: str, groups: Groups, clients: int, width: int) -> list[str]:
    """``groups`` as "title dataset: what value · what value", one line per dataset, at most
    :data:`LINES_PER_SECTION` lines (the datasets beyond join the last), each cut to ``width``."""
    by_dataset: dict[str, list[str]] = {}
    for (dataset, what), numbers in groups.items():
        by_dataset.setdefault(dataset, []).append(f"{what} {summarised(numbers, clients)}")
    items = [f"{dataset}: " + " · ".join(parts) for dataset, parts in by_dataset.items()]
    if len(items) > LINES_PER_SECTION:
        items = [*items[: LINES_PER_SECTION - 1], " | ".join(items[LINES_PER_SECTION - 1 :])]
    return [clip(f"{title} {item}", width) for item in items]


def clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` characters, an ellipsis marking the cut (a wrapped line would
    push the bars below it down at every refresh)."""
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def terminal_width(default: int = 100) -> int:
    """The columns of the terminal standard error writes to (``default`` when it has none)."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return default
    return columns or default


# ---------------------------------------------------------------------------- the hooks


class Quiet:
    """The hooks a run calls as its phases start; they do nothing (logs, ranks other than 0)."""

    def round_started(self, number: int) -> None:
        """Round ``number`` starts."""

    def phase(self, name: str) -> None:
        """A phase of the round starts: "server step (aggregation)", "evaluation", ..."""

    def training(self, done: int, total: int) -> None:
        """Training client ``done + 1`` of this rank's ``total`` starts."""

    def trained(self, client: str, losses: Mapping[str, float]) -> None:
        """``client`` trained: its mean loss per task."""

    def round_done(self, number: int, values: Mapping[str, float], line: str) -> None:
        """Round ``number`` ended with ``values`` logged; ``line``: its log line."""

    def close(self) -> None:
        """The run ended."""


class LiveView(Quiet):
    """The rounds bar and the status lines below it (see the module's docstring)."""

    def __init__(self, first: int, rounds: int, datasets: Mapping[str, str], clients: int) -> None:
        self.datasets, self.clients, self.rounds = dict(datasets), clients, rounds
        self.losses: Groups = {}  # this round's, so far
        self.metrics: tuple[int, Groups] | None = None  # the last evaluation's
        self.bar = tqdm(total=rounds, initial=first - 1, desc="rounds", unit="round", dynamic_ncols=True)
        self.lines: list[tqdm] = []

    def _status(self, lines: list[str]) -> None:
        """The status lines below the bar; more lines than before open new ones."""
        while len(self.lines) < len(lines):
            self.lines.append(tqdm(total=0, position=len(self.lines) + 1, bar_format="{desc}", leave=False))
        for bar, line in zip(self.lines, lines + [""] * (len(self.lines) - len(lines)), strict=True):
            bar.set_description_str(line, refresh=False)
            bar.refresh()

    def _show(self) -> None:
        width = terminal_width()
        lines = section_lines("loss", self.losses, self.clients, width)
        if self.metrics is not None:
            number, groups = self.metrics
            lines += section_lines(f"val (round {number})", groups, self.clients, width)
        self._status(lines)

    def round_started(self, number: int) -> None:
        self.bar.set_description_str(f"round {number}/{self.rounds}", refresh=False)
        self.losses = {}

    def phase(self, name: str) -> None:
        self.bar.set_postfix_str(name)

    def training(self, done: int, total: int) -> None:
        self.phase(f"training client {done + 1}/{total}")

    def trained(self, client: str, losses: Mapping[str, float]) -> None:
        if client in self.datasets:
            for task, value in losses.items():
                self.losses.setdefault((self.datasets[client], task), []).append(value)
        self._show()

    def round_done(self, number: int, values: Mapping[str, float], line: str) -> None:
        self.losses = loss_groups(values, self.datasets) or self.losses  # every rank's clients
        metrics = metric_groups(values, self.datasets)
        if metrics:
            self.metrics = (number, metrics)
        self.bar.write(line, file=sys.stderr)  # above the bars: the history stays on screen
        self.bar.update(1)
        self._show()

    def close(self) -> None:
        for bar in self.lines:
            bar.close()
        self.bar.close()
