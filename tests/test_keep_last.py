"""checkpoint_keep: how many complete checkpoints a run keeps (issue 37, item 9: one round of
104 tiny clients left GBs in the run directory, with no option to keep fewer)."""

from __future__ import annotations

from pathlib import Path

from helpers import fit, fit_killed_in_round, fit_refused, tiny_config

from fedmtl.federated import checkpoint


def _rounds(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("round_"))


def _publish(run_dir: Path, round_: int, keep: int) -> None:
    staging = checkpoint.staging_dir(run_dir, round_)
    staging.mkdir(parents=True)
    checkpoint.publish(run_dir, round_, {"round": round_}, keep=keep)


def test_a_checkpoint_keep_below_one_is_one_line_naming_it(tmp_path, data_root, capsys):
    config = tiny_config(tmp_path, data_root, checkpoint_keep=0)
    lines = fit_refused(config, tmp_path / "run", capsys)
    assert lines == [
        "error: checkpoint_keep must be at least 1, got 0 (the newest checkpoint is what a resume needs; "
        "2 keeps one to fall back on)"
    ]


def test_publish_keeps_the_newest_and_never_a_folder_it_does_not_own(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "notes.txt").write_text("mine")
    (tmp_path / "checkpoints" / "round_0001.superseded").mkdir()  # evidence, never deleted
    for round_ in (1, 2, 3):
        _publish(tmp_path, round_, keep=2)
    assert _rounds(tmp_path) == ["round_0001.superseded", "round_0002", "round_0003"]
    _publish(tmp_path, 4, keep=1)
    assert _rounds(tmp_path) == ["round_0001.superseded", "round_0004"]
    assert (tmp_path / "checkpoints" / "notes.txt").read_text() == "mine"
    assert checkpoint.resumable(tmp_path) == (tmp_path / "checkpoints" / "round_0004", None)


def test_keep_one_leaves_only_the_newest_and_a_resume_continues_from_it(tmp_path, data_root, monkeypatch):
    config = tiny_config(tmp_path, data_root, rounds=3, checkpoint_every=1, checkpoint_keep=1)
    run_dir = tmp_path / "run"
    fit_killed_in_round(config, run_dir, monkeypatch, 3)
    assert _rounds(run_dir) == ["round_0002"]
    fit(config, run_dir, "--resume", "true")
    assert _rounds(run_dir) == ["round_0003"]
    assert (run_dir / "checkpoints" / "latest").read_text() == "round_0003"
