"""Receipts: the server's output kept per client until the client is next loaded (receipts.py).

The bookkeeping on hand cases (who gets a receipt, what supersedes what, which rows stay until
which client took them), and through the engine: a run's clients as its checkpoint leaves them
(stored state + pending receipts) equal what applying every output at once would give, and a
round in which only some clients train loads only those.
"""

from __future__ import annotations

import pytest
import torch

from fedmtl.aggregation.stream import EncoderMix
from fedmtl.federated import checkpoint
from fedmtl.federated.receipts import FileRowStore, Receipt, Receipts
from fedmtl.federated.store import ENCODER_ROW, safe_load
from tests.helpers import client_states, file_hashes, fit, fit_in_processes, stored_states, tiny_config

P = 3
DECODERS = {0: [0], 1: [1], 2: [2, 3]}  # client -> its rows in the decoder stack


def _receipt(
    round_: int, own_trained: list[float], own_delta: list[float] | None = None, kept=None
) -> Receipt:
    n = len(own_trained)
    own = {"trained": torch.tensor(own_trained, dtype=torch.float64)}
    if own_delta is not None:
        own["delta"] = torch.tensor(own_delta, dtype=torch.float64)
    mix = EncoderMix(torch.ones(1, P), torch.ones(n, 1, dtype=torch.float64), own)
    decoders = torch.full((4, 2), float(round_))
    return Receipt(round_, mix, decoders, decoders_kept=None if kept is None else torch.tensor(kept))


def _receipts(tmp_path, mine=(0, 1, 2)) -> Receipts:
    return Receipts(FileRowStore(tmp_path / "rows"), list(mine))


def test_a_receipt_goes_to_the_receivers_and_a_full_replacement_supersedes_older_ones(tmp_path):
    receipts = _receipts(tmp_path)
    receipts.issue(_receipt(1, [0, 0, 0]), [0, 1, 2], DECODERS, {})
    receipts.issue(_receipt(2, [0, 0, 0]), [0, 2], DECODERS, {})  # client 1 sat it out (dropped)
    assert receipts.pending == {0: [2], 1: [1], 2: [2]}
    assert [r.round for r in receipts.of(1)] == [1]


def test_a_receipt_that_starts_from_the_clients_own_encoder_is_applied_after_the_older_one(tmp_path):
    receipts = _receipts(tmp_path)
    receipts.issue(_receipt(1, [0, 0, 0]), [0, 1, 2], DECODERS, {})
    receipts.issue(_receipt(2, [1, 1, 1]), [0, 1, 2], DECODERS, {})  # θ_i = own + shared: a chain
    assert receipts.pending == {0: [1, 2], 1: [1, 2], 2: [1, 2]}
    kept_rows = _receipt(3, [0, 0, 0], kept=[False, True, False, False])
    receipts.issue(kept_rows, [0, 1, 2], DECODERS, {})  # client 1's decoder is kept: still a chain
    assert receipts.pending == {0: [3], 1: [1, 2, 3], 2: [3]}


def test_a_receipt_that_leaves_a_client_as_it_is_is_not_given(tmp_path):
    receipts = _receipts(tmp_path)
    identity = _receipt(1, [1, 1, 1], kept=[True] * 4)
    identity.encoders = EncoderMix.kept(3, P)
    receipts.issue(identity, [0, 1, 2], DECODERS, {})
    assert receipts.pending == {}


def test_own_rows_stay_until_the_client_took_its_receipt(tmp_path):
    receipts = _receipts(tmp_path)
    rows = receipts.rows
    for i in range(3):
        rows.write(1, i, "delta", torch.full((P,), float(i)))
        rows.write(1, i, "trained", torch.zeros(P))
    receipts.issue(_receipt(1, [1, 1, 1], own_delta=[-1, -1, 0]), [0, 1, 2], DECODERS, {})
    receipts.drop_unneeded(1, ["delta", "trained"])
    # "trained" is the encoder the client holds: never kept; "delta" where a receipt names it
    assert [rows.files(1, i, "trained") for i in range(3)] == [None, None, None]
    assert rows.files(1, 0, "delta") and rows.files(1, 1, "delta") and rows.files(1, 2, "delta") is None
    assert torch.equal(rows.read(1, 1, "delta", P), torch.ones(P))
    receipts.consumed(0)
    assert rows.files(1, 0, "delta") is None and rows.files(1, 1, "delta") is not None
    assert receipts.pending == {1: [1], 2: [1]}


def test_receipts_held_by_no_client_of_any_rank_are_forgotten(tmp_path):
    receipts = _receipts(tmp_path, mine=[0])
    receipts.issue(_receipt(1, [0, 0, 0]), [0], DECODERS, {})
    receipts.issue(_receipt(2, [0, 0, 0]), [0], DECODERS, {})
    receipts.prune(receipts.held_rounds() | {1})  # another rank's client still holds round 1
    assert sorted(receipts.by_round) == [1, 2]
    receipts.consumed(0)
    receipts.prune(receipts.held_rounds())
    assert receipts.by_round == {}


def test_a_receipt_survives_its_state_dict():
    receipt = _receipt(4, [1, 0, 1], own_delta=[-1, 0, 2], kept=[True, False, False, True])
    again = Receipt.from_state_dict(receipt.state_dict())
    assert again.round == 4 and torch.equal(again.decoders, receipt.decoders)
    assert torch.equal(again.decoders_kept, receipt.decoders_kept)
    assert {k: v.tolist() for k, v in again.encoders.own.items()} == {
        k: v.tolist() for k, v in receipt.encoders.own.items()
    }


# ---------------------------------------------------------------------------- through the engine


def test_the_checkpoint_keeps_trained_states_and_applying_their_receipts_shares_the_encoder(
    tmp_path, data_root
):
    """FedAvg, 2 rounds: the checkpoint's client files hold what each client trained (nothing
    was written back), and the states with their receipts applied hold one shared encoder."""
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, rounds=2)
    fit(config, tmp_path / "run")
    stored = [s["model"] for s in stored_states(tmp_path / "run")]
    applied = [s["model"] for s in client_states(tmp_path / "run")]
    keys = [k for k in stored[0] if k.startswith("encoder.") and stored[0][k].is_floating_point()]
    keys = [k for k in keys if "running" not in k]  # BatchNorm statistics stay local

    def same(a: dict, b: dict) -> bool:
        return all(torch.equal(a[k], b[k]) for k in keys)

    assert not same(stored[0], stored[1])  # each trained its own
    assert same(applied[0], applied[1]) and same(applied[0], applied[2])
    assert not same(applied[0], stored[0])


@pytest.fixture(scope="module")
def disk_rows(module_dir, data_root):
    """FedHCA2 with its rows in files and its clients on disk, 3 rounds, uninterrupted: its
    receipts name each client's own "delta" row, which checkpoints must carry."""
    tmp = module_dir / "disk_rows"
    tmp.mkdir()
    config = tiny_config(
        tmp, data_root, algorithm={"class_path": "FedHCA2"}, store="disk", aggregation="streamed"
    )
    return config, fit(config, tmp / "straight"), tmp


@pytest.mark.parametrize(
    "where",
    [("fedmtl.federated.rounds.Round", "server_step"), ("fedmtl.federated.evaluator.Evaluator", "evaluate")],
    ids=["server_step", "evaluate"],
)
def test_a_run_killed_in_any_phase_resumes_to_the_uninterrupted_runs_results(disk_rows, monkeypatch, where):
    import importlib

    config, straight, tmp = disk_rows
    owner, name = where
    module, cls = owner.rsplit(".", 1)
    target = getattr(importlib.import_module(module), cls)
    original = getattr(target, name)

    def killed(self, *args, **kwargs):
        number = getattr(self, "number", None)
        if number == 3 or (number is None and self.fed.clients.receipts.held_rounds() == {3}):
            raise KeyboardInterrupt("killed")
        return original(self, *args, **kwargs)

    run_dir = tmp / f"killed-{name}"
    with monkeypatch.context() as patch:
        patch.setattr(target, name, killed)
        with pytest.raises(KeyboardInterrupt):
            fit(config, run_dir)
    assert checkpoint.latest(run_dir).name == "round_0002"
    assert any(p.name.startswith("rows_r0002_") for p in checkpoint.latest(run_dir).iterdir())
    assert fit(config, run_dir, "--resume", "true") == straight
    # The final checkpoints hold the same bytes (server state, clients, pending receipts' rows)
    last = "checkpoints/round_0003"
    assert file_hashes(run_dir / last) == file_hashes(tmp / "straight" / last)


@pytest.fixture(scope="module")
def encoders_in_rows(module_dir, data_root):
    """FedAvg (two of three clients a round) with its "trained" rows in files and its clients
    on disk, 3 rounds, uninterrupted: a stored client's encoder stays in its row."""
    tmp = module_dir / "encoders_in_rows"
    tmp.mkdir()
    algorithm = {"class_path": "FedAvg", "init_args": {"participation": 0.67}}
    config = tiny_config(tmp, data_root, algorithm=algorithm, store="disk", aggregation="streamed")
    return config, fit(config, tmp / "straight"), tmp


def test_a_stored_client_leaves_its_encoder_in_its_trained_row_and_reads_back_whole(encoders_in_rows):
    config, straight, tmp = encoders_in_rows
    folder = checkpoint.latest(tmp / "straight")
    raw = safe_load(folder / "client_0000.pt")
    keys = raw[ENCODER_ROW]["keys"]
    assert keys and all(k.startswith("encoder.") for k in keys)
    assert not set(keys) & set(raw["model"])  # the file holds the encoder's buffers, not its parameters
    assert (folder / f"rows_r{raw[ENCODER_ROW]['round']:04d}_client_0000.trained.f32").is_file()
    # The same run with its clients in memory stores whole states: the same clients, bit for bit
    assert fit(config, tmp / "memory", "--store", "memory") == straight
    for disk, memory in zip(stored_states(tmp / "straight"), stored_states(tmp / "memory"), strict=True):
        assert list(disk["model"]) == list(memory["model"])
        assert all(torch.equal(disk["model"][k], memory["model"][k]) for k in memory["model"])


def test_a_run_whose_encoders_are_in_rows_resumes_after_a_kill_bit_for_bit(encoders_in_rows, monkeypatch):
    """Killed in round 3 once a client was stored with its round-3 row: the resume reads the
    checkpoint, not what the killed attempt left in the store."""
    from fedmtl.federated.rounds import Round

    config, straight, tmp = encoders_in_rows
    run_dir = tmp / "killed"
    original, trained = Round.train_client, []

    def killed(self, i, *args):
        if self.number == 3 and trained:
            raise KeyboardInterrupt("killed")
        out = original(self, i, *args)
        if self.number == 3 and args[1]:  # it took part: stored
            trained.append(i)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(Round, "train_client", killed)
        with pytest.raises(KeyboardInterrupt):
            fit(config, run_dir)
    assert trained and checkpoint.latest(run_dir).name == "round_0002"
    assert fit(config, run_dir, "--resume", "true") == straight
    last = "checkpoints/round_0003"
    assert file_hashes(run_dir / last) == file_hashes(tmp / "straight" / last)


def test_encoders_in_rows_on_two_processes_equal_one(encoders_in_rows):
    """Each rank stores its own clients with their rows in the shared row folder: the same
    results and final checkpoint bytes as one process."""
    config, straight, tmp = encoders_in_rows
    assert fit_in_processes(config, tmp / "two") == straight
    last = "checkpoints/round_0003"
    assert file_hashes(tmp / "two" / last) == file_hashes(tmp / "straight" / last)
