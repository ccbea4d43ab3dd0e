"""Issue #36: a run's bookkeeping grows with the rounds done, not with the rounds planned.

A run meant to go until stopped (``--rounds 100000000``) writes a manifest of a few hundred
bytes (its round folders as a handful of glob patterns, not one name per planned round), and
the engine's per-round tables (pending receipts, held receipts) are sized by the round reached,
so round 1 starts and checkpoints as in a short run. The patterns match exactly the folders of
rounds 1..R, so ``--overwrite`` still removes exactly what the run wrote.
"""

from __future__ import annotations

import fnmatch
import json

import pytest
import torch

from fedmtl.federated import checkpoint, manifest
from fedmtl.federated.rundir import MANIFEST_FILE
from tests.helpers import fit_killed_in_round, tiny_config

FOREVER = 10**8


@pytest.mark.parametrize("rounds", [1, 3, 9, 10, 99, 100, 123, 999, 1000, 4321, 9999, 10000, 10001, 12345])
def test_round_patterns_match_exactly_the_rounds_of_the_run(rounds):
    patterns = checkpoint.round_globs(rounds)
    names = [checkpoint.round_name(r) for r in range(0, rounds + 1001)]
    matched = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    assert matched == [checkpoint.round_name(r) for r in range(1, rounds + 1)]
    assert len(patterns) <= 4 * len(str(rounds))  # a handful, however many rounds


def test_the_manifest_of_a_run_planned_forever_is_small(tmp_path):
    manifest.record(tmp_path, FOREVER, 2)
    text = (tmp_path / MANIFEST_FILE).read_text()
    assert len(text.encode()) < 4096
    listed = [p.split("/") for p in manifest.read(tmp_path)["paths"]]
    for round_ in (1, 12345, FOREVER):  # owned, so --overwrite removes them
        assert manifest._matches(["checkpoints", checkpoint.round_name(round_)], listed)
    assert not manifest._matches(["checkpoints", checkpoint.round_name(FOREVER + 1)], listed)
    assert not manifest._matches(["checkpoints", "round_best"], listed)  # a user's folder stays


def test_an_older_manifest_naming_every_round_is_left_as_it_is(tmp_path):
    # Written by a fedmtl that listed each round: a resume of its finished run changes no file.
    manifest.record(tmp_path, 3, 1)
    old = json.loads((tmp_path / MANIFEST_FILE).read_text())
    old["paths"] = [p for p in old["paths"] if not p.startswith("checkpoints/round_")]
    old["paths"] = sorted(
        [
            *old["paths"],
            *(f"checkpoints/round_000{r}{s}" for r in (1, 2, 3) for s in ("", ".tmp", ".superseded*")),
        ]
    )
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(old, indent=1) + "\n")
    before = (tmp_path / MANIFEST_FILE).read_text()
    manifest.record(tmp_path, 3, 1)
    assert json.loads((tmp_path / MANIFEST_FILE).read_text())["paths"] == old["paths"]
    assert (tmp_path / MANIFEST_FILE).read_text() == before


def test_a_fit_planned_forever_runs_round_one_without_tables_of_every_planned_round(
    tmp_path, data_root, monkeypatch
):
    config = tiny_config(tmp_path, data_root, rounds=FOREVER, evaluation={"every": 0})
    run_dir = tmp_path / "run"
    largest = []
    zeros = torch.zeros

    def recording(*size, **kwargs):
        made = zeros(*size, **kwargs)
        largest.append(made.numel())
        return made

    monkeypatch.setattr(torch, "zeros", recording)
    fit_killed_in_round(config, run_dir, monkeypatch, round_=2)  # stopped once round 1 is saved
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "round_0001"
    assert max(largest) < 10**6  # no table of clients x 10^8 planned rounds
    assert (run_dir / MANIFEST_FILE).stat().st_size < 4096
    assert (run_dir / "checkpoints" / "round_0001" / "server.pt").stat().st_size < 10**6
