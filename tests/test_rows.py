"""A streamed round's row files (fedmtl/federated/rows.py): what is written is what blocks read,
a client without a row reads as zeros, made rows go to the rank's own clients only, a short
file is named, and a round's start clears what it must."""

from __future__ import annotations

import pytest
import torch

from fedmtl.federated import rows


def test_blocks_read_back_what_was_written_and_missing_rows_are_zeros(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3, 50)
    for client in (0, 2):  # client 1 did not train
        rows.write_row(tmp_path, client, "trained", x[client])
    source = rows.FileRows("trained", tmp_path, numel=50, num_rows=3, block_columns=7)
    expected = x.clone()
    expected[1] = 0
    assert torch.equal(torch.cat([source.read([0, 1, 2], c) for c in source.blocks()], dim=1), expected)
    assert torch.equal(rows.read_row(tmp_path, 2, "trained", 50), x[2])
    weights = torch.tensor([[0.5, 0.0, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(source.weighted_sums(weights)[0], (x[0] + x[2]) / 2)


def test_made_rows_are_written_for_the_owned_clients_only(tmp_path):
    x = torch.arange(12.0).reshape(3, 4)
    for client in range(3):
        rows.write_row(tmp_path, client, "trained", x[client])
    source = rows.FileRows("trained", tmp_path, numel=4, num_rows=3, owned=[1, 2], block_columns=3)
    swap = torch.tensor([[0.0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=torch.float64)
    source.mix(swap, into="cloud")
    assert not rows.row_path(tmp_path, 0, "cloud").exists()
    assert torch.equal(rows.read_row(tmp_path, 1, "cloud", 4), x[2])
    assert torch.equal(rows.read_row(tmp_path, 2, "cloud", 4), x[0])


def test_a_short_row_file_is_named(tmp_path):
    rows.write_row(tmp_path, 0, "delta", torch.zeros(3))
    with pytest.raises(ValueError, match=r"client_0000\.delta\.f32 ends early: it holds fewer than the 5"):
        rows.read_row(tmp_path, 0, "delta", 5)


def test_a_round_starts_without_its_own_stale_rows_and_keeps_earlier_rounds(tmp_path):
    """Rows of an earlier round stay (a pending receipt may name them: receipts.py drops them);
    what a killed attempt at this round left of this rank's clients goes."""
    before, now = rows.round_folder(tmp_path, 2), rows.round_folder(tmp_path, 3)
    rows.write_row(before, 0, "delta", torch.zeros(2))
    for client in (0, 1):  # left by a killed attempt at round 3
        rows.write_row(now, client, "trained", torch.ones(2))
    rows.start_round(tmp_path, 3, clients=[0], names=["trained"])
    assert rows.row_path(before, 0, "delta").exists()
    assert not rows.row_path(now, 0, "trained").exists()  # this rank's client
    assert rows.row_path(now, 1, "trained").exists()  # another rank's: it clears its own
