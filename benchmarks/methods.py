"""What each federated method costs over FedAvg: round time on the demo, client state, server step.

    .venv/bin/python benchmarks/methods.py                                   # all parts, every method
    .venv/bin/python benchmarks/methods.py --part rounds --methods FedAvg FedProx Ditto --rounds 1
    .venv/bin/python benchmarks/methods.py --part state [--methods ...] [--rounds 2]
    .venv/bin/python benchmarks/methods.py --part server [--threads 1] [--repeats 5]

1. rounds: every method (default: all registered ones) trains the demo scenario
   (``configs/demo.yaml``; its data is generated first if missing) for ``--rounds`` rounds,
   each run a fresh process of

       python -m fedmtl fit --config configs/demo.yaml --algorithm NAME --rounds R
           --evaluation.every 0 --cpu_threads 1 --logger.wandb false --checkpoint_every 0 --run_dir TMP

   The runs are taken in turns (for each repeat, every method once), so a machine that gets
   busier slows all methods alike. From each run's metrics.csv: the mean per round of
   ``time/train``, ``time/exchange``, ``time/aggregate`` and ``time/write_back`` (their sum is
   the round time), and
   ``time/finish``, the one-off work after the last round (FedBABU's fine-tuning), shown in
   seconds and in FedAvg rounds, and as the overhead it adds to a run of the demo's and of the
   paper's 100 rounds. Evaluation (always after the last round) is excluded. Printed: the
   median (and min) over ``--repeats`` runs and their ratio to FedAvg's. Targets: a round at
   most 1.15x FedAvg's, Ditto (two models per client) at most 2.2x. About 2 min per method
   at 2 rounds on one core. FedSTA's phase B is a fifth of the run, rounded: none below 3 rounds.
2. state: each method's client state in its final checkpoint (``client_XXXX.pt``), mean over
   the clients: file size, and tensor bytes of the federated track (``model``, ``optimizer``,
   ``scheduler``) and of the method's ``personal`` state. Uses the first repeat's runs of part
   1 if it ran, else one run per method.
3. server: the server step at scenario 1's shapes (as benchmarks/aggregation.py: N = 6 Swin-T
   encoders, K = 9 FCN decoders; θ^(r-1) the initial weights, Δ = 1e-3 x randn, float32), the
   ``aggregate`` of round 1 of FedAvg, FedAMP (target: at most 3x FedAvg), and for information
   of MaTFL and FedProx (``--server-methods``), with ``--threads`` CPU threads; a clone of the
   encoder deltas is timed as a scale. Median (and min) of ``--repeats`` calls taken in turns
   after one warm-up of each. Needs about 4 GiB.

Absolute times depend on the machine and its load; the ratios are what the script is for.
Each part's tables are recorded in ``benchmarks/results/methods_PART.md`` (``methods_rounds``,
``methods_state``, ``methods_server``; results_file.py): a part run alone replaces only its own.
"""

from __future__ import annotations

import argparse
import csv
import gc
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import results_file
import torch

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "FedAvg"
TARGETS = {"Ditto": 2.2}  # x FedAvg's round time; every other method: DEFAULT_TARGET
DEFAULT_TARGET = 1.15
SERVER_TARGETS = {"FedAMP": 3.0}  # x FedAvg's server step
CLONE = "clone of Δ_enc"  # the server part's scale: a copy of the encoder deltas
PHASES = ("train", "exchange", "aggregate", "write_back", "finish")
TRACK = ("model", "optimizer", "scheduler")
MIB = 1024**2


# ---------------------------------------------------------------------- the demo runs


def ensure_data(config: Path) -> Path:
    """Generate the scenario's synthetic data if it is missing (as ``fedmtl fit`` would on
    first use, but before any timed run); returns the data root. Relative roots are taken
    from the repository root, where the runs are started."""
    from fedmtl.cli import _ensure_data, _run_parser

    parser = _run_parser()
    ns = parser.parse_args(["--config", str(config), "--logger.wandb", "false"])
    ns.pop("config", None)
    cfg = parser.instantiate(ns)
    cfg.data.root = str(ROOT / cfg.data.resolved_root())
    _ensure_data(cfg)
    return Path(cfg.data.root)


def demo_rounds(config: Path) -> int:
    """The rounds the scenario itself runs (the demo: 10)."""
    import yaml

    return int(yaml.safe_load(config.read_text()).get("rounds", 100))


def warm_page_cache(root: Path) -> None:
    """Read every data file once, so the first run does not pay for a cold disk cache."""
    for path in root.rglob("*"):
        if path.is_file():
            path.read_bytes()


def fit(config: Path, method: str, rounds: int, run_dir: Path) -> None:
    """One demo run of ``method`` in a fresh process; raises with its stderr if it fails."""
    command = [
        sys.executable, "-m", "fedmtl", "fit", "--config", str(config), "--algorithm", method,
        "--rounds", str(rounds), "--evaluation.every", "0", "--cpu_threads", "1",
        "--logger.wandb", "false", "--checkpoint_every", "0", "--run_dir", str(run_dir),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{method}: `fedmtl fit` exited with {out.returncode}:\n{out.stderr[-3000:]}")


def phase_times(metrics_csv: Path, rounds: int) -> dict[str, float]:
    """Mean seconds per round of train, exchange, aggregate and write_back, their sum
    ``round``, and the total seconds of ``finish`` (once, after the last round; none for a
    method without finishing work)."""
    sums: dict[str, float] = defaultdict(float)
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            if row["key"].startswith("time/"):
                sums[row["key"][len("time/") :]] += float(row["value"])
    times = {phase: sums.get(phase, 0.0) / rounds for phase in PHASES if phase != "finish"}
    times["round"] = sum(times.values())
    times["finish"] = sums.get("finish", 0.0)
    return times


def run_all(
    config: Path, methods: list[str], rounds: int, repeats: int, tmp: Path, keep_first: bool
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Path]]:
    """Times per method (one dict per repeat) of runs taken in turns, and the run directories
    of the first repeat when ``keep_first`` (later repeats are deleted as they finish)."""
    times: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    kept: dict[str, Path] = {}
    for r in range(repeats):
        for method in methods:
            run_dir = tmp / f"{method}-{r}"
            start = time.perf_counter()
            fit(config, method, rounds, run_dir)
            times[method].append(phase_times(run_dir / "metrics.csv", rounds))
            print(
                f"  repeat {r + 1}/{repeats} {method}: {time.perf_counter() - start:.0f} s, "
                f"round {times[method][-1]['round']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            if keep_first and r == 0:
                kept[method] = run_dir
            else:
                shutil.rmtree(run_dir, ignore_errors=True)
    return times, kept


def rounds_table(
    times: dict[str, list[dict[str, float]]], config: Path, rounds: int, repeats: int, run_rounds: int
) -> list[str]:
    """Part 1 as markdown: the round time per method against FedAvg's, and the finishing work."""
    med = {
        m: {k: statistics.median(t[k] for t in runs) for k in (*PHASES, "round")} for m, runs in times.items()
    }
    low = {m: {k: min(t[k] for t in runs) for k in (*PHASES, "round")} for m, runs in times.items()}
    ref_med, ref_low = med[REFERENCE], low[REFERENCE]
    lines = [
        f"{config.name}, {rounds} round(s) per run, 1 CPU thread: seconds per round (train + exchange + "
        f"aggregate + write back; the final evaluation excluded), median of {repeats} run(s), every "
        f"method once per repeat, in turns. Ratios: against {REFERENCE}'s in this run, of the medians "
        "and in brackets of the mins. Target: a round at most the ratio given.",
        "",
        results_file.table_head(
            "method",
            "train (s)",
            "exchange (s)",
            "aggregate (s)",
            "write back (s)",
            "round (s)",
            f"train / {REFERENCE}",
            f"round / {REFERENCE}",
            "target",
        ),
    ]
    for method in times:
        m, lo = med[method], low[method]
        target = TARGETS.get(method, DEFAULT_TARGET)
        verdict = "ok" if m["round"] <= target * ref_med["round"] else "OVER"
        lines.append(
            results_file.row(
                method,
                f"{m['train']:.2f}",
                f"{m['exchange']:.3f}",
                f"{m['aggregate']:.2f}",
                f"{m['write_back']:.2f}",
                f"{m['round']:.2f}",
                _ratio(m["train"], ref_med["train"], lo["train"], ref_low["train"]),
                _ratio(m["round"], ref_med["round"], lo["round"], ref_low["round"]),
                "reference" if method == REFERENCE else f"≤ {target:.2f}× {verdict}",
            )
        )
    finishing = [m for m in times if med[m]["finish"] - ref_med["finish"] >= 0.5]  # less: no finishing work
    if finishing:
        lines += [
            "",
            "One-off work after the last round (finish), median; overhead = finish / (rounds × the "
            "method's round).",
            "",
            results_file.table_head(
                "method",
                "finish (s)",
                f"{REFERENCE} rounds",
                f"overhead, {run_rounds} rounds",
                "overhead, 100 rounds (paper)",
            ),
        ]
        for method in finishing:
            m = med[method]
            lines.append(
                results_file.row(
                    method,
                    f"{m['finish']:.1f}",
                    f"{m['finish'] / ref_med['round']:.1f}",
                    f"{m['finish'] / (run_rounds * m['round']):.1%}",
                    f"{m['finish'] / (100 * m['round']):.1%}",
                )
            )
    return lines


def _ratio(value: float, ref: float, value_min: float, ref_min: float) -> str:
    return f"{value / ref:.2f} ({value_min / ref_min:.2f})"


# ---------------------------------------------------------------------- client state


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in nested dicts / lists / tuples."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def client_state_sizes(run_dir: Path) -> dict[str, float]:
    """Mean bytes per client of the final checkpoint: ``file``, each part of the federated
    track, ``track`` (their sum) and ``personal``."""
    from fedmtl.federated import checkpoint
    from fedmtl.federated.store import safe_load

    folder = checkpoint.latest(run_dir)
    if folder is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir}")
    files = sorted(folder.glob("client_*.pt"))
    sizes: dict[str, float] = defaultdict(float)
    clients = {path.name.split(".")[0] for path in files}  # client_N.pt and client_N.optim.pt
    for path in files:
        state = safe_load(path)
        sizes["file"] += path.stat().st_size
        for key in TRACK:
            sizes[key] += tensor_bytes(state.get(key))
        sizes["personal"] += tensor_bytes(state.get("personal"))
    sizes["track"] = sum(sizes[key] for key in TRACK)
    return {k: v / len(clients) for k, v in sizes.items()}


def state_table(sizes: dict[str, dict[str, float]], rounds: int) -> list[str]:
    """Part 2 as markdown: each method's client state against FedAvg's."""
    lines = [
        f"Client state after {rounds} round(s): MiB per client, mean over the clients' checkpoint "
        "files; track = the model, optimizer and scheduler tensors, personal = the method's own "
        f"state's tensors. Ratio: the file size over {REFERENCE}'s.",
        "",
        results_file.table_head(
            "method", "file", "model", "optimizer", "scheduler", "track", "personal", f"file / {REFERENCE}"
        ),
    ]
    ref = sizes.get(REFERENCE, {}).get("file")
    for method, s in sizes.items():
        mib = (f"{s[key] / MIB:.2f}" for key in ("file", *TRACK, "track", "personal"))
        lines.append(results_file.row(method, *mib, f"{s['file'] / ref:.2f}" if ref else ""))
    return lines


# ---------------------------------------------------------------------- the server step


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """``repeats`` timings of each function, taken in turns after one warm-up of each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            result = fn()
            seconds = time.perf_counter() - start
            del result
            if i:
                times[name].append(seconds)
    return times


def server(methods: list[str], repeats: int) -> list[str]:
    """Part 3 as markdown: the server step of FedAvg and ``methods``, and a clone as a scale."""
    from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput, decoder_owners_of
    from fedmtl.methods import create_method
    from fedmtl.models import FCNDecoder, create_encoder

    clients = [
        *(
            ClientInfo(f"pascal_{task}", "pascal_context", (task,), 1)
            for task in ("semseg", "human_parts", "sal", "normals", "edge")
        ),
        ClientInfo("nyud_mt", "nyud", ("semseg", "normals", "edge", "depth"), 1),
    ]
    encoder = create_encoder("swin_t", img_size=(512, 512))
    decoder = FCNDecoder(encoder.channels, 96)
    enc_layout, dec_layout = FlatLayout.from_module(encoder), FlatLayout.from_module(decoder)
    owners = decoder_owners_of(clients)
    n, k, p, q = len(clients), len(owners), enc_layout.numel, dec_layout.numel
    g = torch.Generator().manual_seed(0)
    inputs = RoundInput(
        1,
        clients,
        enc_layout,
        enc_layout.flatten(encoder, torch.float32).repeat(n, 1),
        1e-3 * torch.randn(n, p, generator=g),
        dec_layout,
        owners,
        dec_layout.flatten(decoder, torch.float32).repeat(k, 1),
        1e-3 * torch.randn(k, q, generator=g),
    )
    del encoder, decoder
    aggregators = {}
    for name in dict.fromkeys([REFERENCE, *methods]):
        aggregators[name] = create_method(name)
        aggregators[name].setup(1, clients, 0)
    fns: dict[str, Callable[[], object]] = {CLONE: inputs.encoder_deltas.clone}
    fns.update({name: (lambda a=a, x=inputs: a.aggregate(x)) for name, a in aggregators.items()})
    times = interleaved(fns, repeats)

    med = {name: statistics.median(t) for name, t in times.items()}
    low = {name: min(t) for name, t in times.items()}
    inputs_gib = 2 * (n * p + k * q) * 4 / 1024**3
    lines = [
        f"Server step, round 1, scenario 1 shapes: N = {n} encoders × P = {p:,}, K = {k} decoders × "
        f"Q = {q:,}, float32 ({inputs_gib:.2f} GiB of θ^(r-1) and Δ), {torch.get_num_threads()} CPU "
        f"thread(s); median (min) of {repeats} calls taken in turns after one warm-up. Ratios: against "
        f"{REFERENCE}.aggregate and against a clone of the encoder deltas (a scale) in this run, of the "
        "medians and in brackets of the mins.",
        "",
        results_file.table_head("step", "median (ms)", "min (ms)", f"× {REFERENCE}", "× clone", "target"),
    ]
    for name in times:
        target = SERVER_TARGETS.get(name)
        verdict = ""
        if target is not None:
            verdict = f"≤ {target:.1f}× {'ok' if med[name] <= target * med[REFERENCE] else 'OVER'}"
        lines.append(
            results_file.row(
                f"{name}.aggregate" if name in aggregators else name,
                f"{med[name] * 1e3:.1f}",
                f"{low[name] * 1e3:.1f}",
                _ratio(med[name], med[REFERENCE], low[name], low[REFERENCE]),
                _ratio(med[name], med[CLONE], low[name], low[CLONE]),
                verdict,
            )
        )
    del inputs, aggregators, fns
    gc.collect()
    return lines


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", default="all", choices=["rounds", "state", "server", "all"])
    parser.add_argument(
        "--config", default=str(ROOT / "configs" / "demo.yaml"), help="the scenario (rounds, state)"
    )
    parser.add_argument(
        "--methods", nargs="+", default=None, help="rounds, state: default every registered method"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each demo run")
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each method (default 1) / server calls (default 5)"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the server part")
    parser.add_argument(
        "--server-methods", nargs="+", default=["FedAMP", "MaTFL", "FedProx"], help="timed against FedAvg"
    )
    args = parser.parse_args(argv)

    from fedmtl.methods import METHODS

    methods = list(args.methods or METHODS.names())
    for name in [*methods, *args.server_methods]:
        METHODS.get(name)  # an unknown name fails here, listing the known ones
    methods = [REFERENCE, *(m for m in dict.fromkeys(methods) if m != REFERENCE)]  # the reference runs too
    parts = {"rounds", "state", "server"} if args.part == "all" else {args.part}
    config = Path(args.config).resolve()

    if parts & {"rounds", "state"}:
        with tempfile.TemporaryDirectory(prefix="fedmtl-methods-") as tmp:
            warm_page_cache(ensure_data(config))
            repeats = (args.repeats or 1) if "rounds" in parts else 1
            times, kept = run_all(
                config, methods, args.rounds, repeats, Path(tmp), keep_first="state" in parts
            )
            if "rounds" in parts:
                lines = rounds_table(times, config, args.rounds, repeats, demo_rounds(config))
                record("rounds", f"Round time of each method against {REFERENCE}'s", lines)
            if "state" in parts:
                sizes = {m: client_state_sizes(run_dir) for m, run_dir in kept.items()}
                record(
                    "state",
                    f"Client state of each method against {REFERENCE}'s",
                    state_table(sizes, args.rounds),
                )
    if "server" in parts:
        torch.set_num_threads(args.threads)
        lines = server(args.server_methods, args.repeats or 5)
        record("server", f"Server step of each method against {REFERENCE}'s", lines)


def record(part: str, title: str, lines: list[str]) -> None:
    """Print a part's table and record it in ``benchmarks/results/methods_PART.md``: one file a
    part, so that a part run on its own replaces only its own figures."""
    print("\n".join(lines), flush=True)
    results_file.record(f"methods_{part}", title, "\n".join(lines))


if __name__ == "__main__":
    main()
