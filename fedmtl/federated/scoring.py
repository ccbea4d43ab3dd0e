"""How a run's metrics were scored: every option that changes a metric's number.

Δm and a table of methods compare numbers, so the runs compared must be scored the same way
(``fedmtl report`` refuses otherwise, naming the option). results.json records the scoring in
its ``"scoring"`` block (:func:`scoring_block`); for a run written before it did, the report
reads the same from the run's config.yaml and data_fingerprint.json (:func:`from_run_files`).

What changes a number, and what does not:

- ``evaluation.edge_thin_gt`` (with an edge task): edge odsF against the thinned or the
  unthinned ground-truth boundary; ``evaluation.edge_max_dist`` the matching radius per dataset.
- ``data.train_size``: the size every validation image is padded to, resolved per dataset
  (null is the paper's size, so null and the paper's size given explicitly are the same).
- ``validation``: per dataset, the validation split the metrics average over (its image count
  and the sha256 of its split file, from the run's data fingerprint), so the same data under
  another root is the same scoring.

Not scoring: ``evaluation.every`` and ``evaluation.clients`` (the last evaluation, which
results.json reports, covers every client), ``evaluation.batch_size`` (every metric pools its
counts over the whole split), where and how the run ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

FINGERPRINT = "data_fingerprint.json"  # = resume_checks.FINGERPRINT, without its imports
EDGE = "edge"


def scoring_block(
    edge_thin_gt: bool | None,
    train_size: Iterable[int] | None,
    scenario: Iterable[tuple[str, Iterable[str]]],
    fingerprint: Mapping[str, Any] | None,
    edge_max_dist: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The ``"scoring"`` block of results.json (pure). ``scenario``: each client's (dataset,
    tasks); ``edge_thin_gt`` / ``edge_max_dist`` None: not known (left out); ``train_size``
    None: each dataset's paper size; ``fingerprint``: the run's data fingerprint, or None."""
    from fedmtl.data.datasets import DATASETS

    pairs = [(dataset, set(tasks)) for dataset, tasks in scenario]
    datasets = sorted({dataset for dataset, _ in pairs})
    edge_datasets = sorted({dataset for dataset, tasks in pairs if EDGE in tasks})
    evaluation: dict[str, Any] = {}
    if edge_datasets and edge_thin_gt is not None:
        evaluation["edge_thin_gt"] = bool(edge_thin_gt)
    if edge_datasets and edge_max_dist is not None:
        evaluation["edge_max_dist"] = {d: edge_max_dist[d] for d in edge_datasets}
    block: dict[str, Any] = {}
    if evaluation:
        block["evaluation"] = evaluation
    block["data"] = {
        "train_size": {
            d: list(train_size) if train_size is not None else list(DATASETS.get(d).train_size)
            for d in datasets
        }
    }
    validation = _validation(fingerprint, datasets)
    if validation:
        block["validation"] = validation
    return block


def _validation(fingerprint: Mapping[str, Any] | None, datasets: list[str]) -> dict[str, Any]:
    """Per dataset, its validation split's image count and split-file sha256 (the fingerprint's)."""
    recorded = fingerprint.get("datasets") if isinstance(fingerprint, Mapping) else None
    if not isinstance(recorded, Mapping):
        return {}
    out = {}
    for dataset in datasets:
        split = ((recorded.get(dataset) or {}).get("splits") or {}).get("val")
        if isinstance(split, Mapping) and "images" in split and "sha256" in split:
            out[dataset] = {"images": split["images"], "sha256": split["sha256"]}
    return out


def read_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """The run's data fingerprint, or None where it has none (or it does not read)."""
    try:
        return json.loads((run_dir / FINGERPRINT).read_text())
    except (OSError, ValueError):
        return None


def from_run_files(
    config: Mapping[str, Any],
    scenario: Iterable[tuple[str, Iterable[str]]],
    fingerprint: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The scoring of a run written before results.json recorded it, from its config.yaml
    (``config``, {} when it has none) and data fingerprint: what they do not say is left out.
    A config with an ``evaluation`` section but no ``edge_thin_gt`` was written before the
    option existed, when edges were scored against the unthinned boundary (false)."""
    evaluation = config.get("evaluation")
    data = config.get("data")
    thin = None
    if isinstance(evaluation, Mapping):
        thin = evaluation.get("edge_thin_gt", False)
    block = scoring_block(thin, None, scenario, fingerprint)
    if not isinstance(data, Mapping):  # no config.yaml: the padding is not known
        del block["data"]
    elif data.get("train_size") is not None:
        block = scoring_block(thin, data["train_size"], scenario, fingerprint)
    return block


def first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """The first option (a dotted name) both blocks record with different values, or None.
    An option one of them does not record is not compared: it is not known."""
    from fedmtl.federated.rundir import flatten

    mine, theirs = flatten(dict(a)), flatten(dict(b))
    for key, value in mine.items():
        if key in theirs and theirs[key] != value:
            return key, value, theirs[key]
    return None


def shown(value: Any) -> str:
    """A value as the config writes it: true/false, [32, 32], numbers and text as they are."""
    return json.dumps(value) if isinstance(value, bool | list | type(None)) else str(value)
