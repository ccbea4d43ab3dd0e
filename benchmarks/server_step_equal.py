"""Every registered method's one server step against main's old stacked step, on the demo's round 1.

    PYTHONPATH=. .venv/bin/python benchmarks/server_step_equal.py [--base 493f2e2] [--train_size 32]

Each method now writes one server step (``Method.server_step``: encoder rows in, an
``EncoderMix`` out); ``Method.aggregate`` runs it on encoder stacks. This script checks that
the change moved no method's output by more than float rounding:

1. it runs the demo (``configs/demo.yaml``, FedHCA²) for one round with fewer and smaller
   generated images, the stacked server step and a data root and run directory of its own
   (temporary), and saves the
   ``RoundInput`` the engine builds (one monkeypatch of ``Simulation._aggregate``);
2. every registered method, with its default options (FedDEA over its default host), computes
   its output on those inputs with this checkout's ``aggregate``, and, in a subprocess on a
   temporary ``git worktree`` of ``--base`` (main before the change), with the old stacked
   ``aggregate`` each method wrote;
3. it prints the largest relative difference ‖new − old‖ / ‖old‖ of each client's encoder,
   each decoder and each head stack, per method, and records the table in
   ``benchmarks/results/server_step_equal.md`` (results_file.py). The target is ≤ 1e-6.

Each method is set up for the demo's 10 rounds (FedSTA's round 1 is in phase A).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import results_file
import torch

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 10  # the demo's, for each method's setup
TARGET = 1e-6

# Run in the old checkout: every registered method's stacked step on the saved inputs.
OLD_STEP = """
import sys, torch
from fedmtl.methods import METHODS, create_method
inputs = torch.load(sys.argv[1], weights_only=False)
out = {}
for name in METHODS.names():
    method = create_method(name)
    method.setup(int(sys.argv[3]), inputs.clients, seed=0)
    o = method.aggregate(inputs)
    out[name] = {"encoders": o.encoders, "decoders": o.decoders, "heads": o.heads}
torch.save(out, sys.argv[2])
"""


def capture_inputs(folder: Path, train_size: int) -> Path:
    """Run the demo for one stacked round in ``folder`` and save the server's RoundInput."""
    from fedmtl import cli
    from fedmtl.federated import engine

    saved = folder / "inputs.pt"
    original = engine.Simulation._aggregate

    def capture(self, inputs):  # the one monkeypatch: save what the server step receives
        if self.round == 1:
            torch.save(inputs, saved)
        return original(self, inputs)

    engine.Simulation._aggregate = capture
    try:
        size = [train_size, train_size]
        synth = {  # fewer, smaller images than the demo's: the server step's shapes stay the demo's
            "pascal_context": {"num_train": 150, "num_val": 10, "size": size},
            "nyud": {"num_train": 32, "num_val": 10, "size": size},
        }
        code = cli.main(
            ["fit", "--config", str(REPO / "configs/demo.yaml"), "--rounds", "1", "--aggregation", "stacked"]
            + ["--data.train_size", json.dumps(size), "--data.synth", json.dumps(synth)]
            + [
                "--logger.wandb",
                "false",
                "--data.root",
                str(folder / "data"),
                "--run_dir",
                str(folder / "run"),
            ]
        )
    finally:
        engine.Simulation._aggregate = original
    if code not in (0, None) or not saved.is_file():
        raise SystemExit(f"the demo's round did not run (exit code {code}); nothing captured")
    return saved


def new_outputs(inputs) -> dict[str, dict]:
    from fedmtl.methods import METHODS, create_method

    out = {}
    for name in METHODS.names():
        method = create_method(name)
        method.setup(ROUNDS, inputs.clients, seed=0)
        o = method.aggregate(inputs)
        o.check_against(inputs)
        out[name] = {"encoders": o.encoders, "decoders": o.decoders, "heads": o.heads}
    return out


def old_outputs(saved: Path, folder: Path, base: str) -> dict[str, dict]:
    """Main's stacked step at commit ``base``, in a subprocess on a temporary worktree."""
    tree = folder / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), base], cwd=REPO, check=True)
    try:
        result = folder / "old.pt"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        args = [sys.executable, "-c", OLD_STEP, str(saved), str(result), str(ROUNDS)]
        subprocess.run(args, cwd=tree, env=env, check=True)
        return torch.load(result, weights_only=False)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


def largest_relative(new: torch.Tensor, old: torch.Tensor) -> float:
    """max over rows of ‖new_i − old_i‖ / ‖old_i‖ (float64)."""
    new, old = new.double().flatten(1), old.double().flatten(1)
    return float(((new - old).norm(dim=1) / old.norm(dim=1).clamp_min(1e-30)).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="493f2e2", help="main's commit with the old stacked steps")
    parser.add_argument("--train_size", type=int, default=32, help="the demo's image side, for speed")
    args = parser.parse_args()
    import fedmtl

    if Path(fedmtl.__file__).resolve().parents[1] != REPO:
        raise SystemExit(
            f"fedmtl imports from {fedmtl.__file__}, not this checkout: run with PYTHONPATH={REPO}"
        )
    with tempfile.TemporaryDirectory(prefix="server_step_equal-") as tmp:
        folder = Path(tmp)
        saved = capture_inputs(folder, args.train_size)
        inputs = torch.load(saved, weights_only=False)
        new = new_outputs(inputs)
        old = old_outputs(saved, folder, args.base)
    shapes = (
        f"N = {inputs.num_clients} encoders × P = {inputs.encoder_layout.numel}, "
        f"K = {inputs.num_decoders} decoders × Q = {inputs.decoder_layout.numel}"
    )
    lines = [
        f"The demo's round-1 inputs ({shapes}, every client trained). Largest relative difference",
        f"per row, ‖new − old‖ / ‖old‖, of this checkout's `aggregate` against the stacked step of {args.base}",
        "(default options; `-`: the method returns no heads). Target: at most 1e-6.",
        "",
        results_file.table_head("method", "encoders", "decoders", "heads", "≤ 1e-6"),
    ]
    worst = 0.0
    for name in sorted(new):
        cells = [largest_relative(new[name][p], old[name][p]) for p in ("encoders", "decoders")]
        heads = "-"
        if new[name]["heads"] is not None or old[name]["heads"] is not None:
            pairs = zip(new[name]["heads"], old[name]["heads"], strict=True)
            heads_error = max((largest_relative(a, b) for a, b in pairs), default=0.0)
            cells.append(heads_error)
            heads = f"{heads_error:.1e}"
        worst = max(worst, *cells)
        ok = "yes" if max(cells) <= TARGET else "NO"
        lines.append(results_file.row(name, f"{cells[0]:.1e}", f"{cells[1]:.1e}", heads, ok))
    lines += ["", f"Largest over every method: {worst:.1e}."]
    body = "\n".join(lines)
    print(body, flush=True)
    results_file.record("server_step_equal", "The one server step against main's stacked step", body)
    if worst > TARGET:
        raise SystemExit(f"a method moved by {worst:.1e} relative, more than {TARGET:.0e}")


if __name__ == "__main__":
    main()
