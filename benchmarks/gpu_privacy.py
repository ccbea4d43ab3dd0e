"""The privacy modes on one GPU: each one runs, what it costs in time and memory, and its ε.

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_privacy.py --tmp /tmp/gpu [--rounds 3] [--smoke]

Seven ``fedmtl fit`` runs of the demo (``configs/demo.yaml``), one after the other in this
process (``gpu_rounds.py``'s runner, so that torch's peak CUDA memory can be read after each),
with ``--accelerator gpu --logger.wandb false``: each privacy mode next to the same run without
privacy (its *baseline*):

- FedAvg, then FedAvg under central DP (z = 1, C = 1, adaptive clipping, secure aggregation)
  in fp32 and in ``16-mixed``;
- FedHCA² (the demo's method), then FedHCA² under local DP (z = 0.1, C = 1);
- FedAvg with ``model.norm: group``, then the same under DP-SGD (``privacy.mode: sample``,
  z = 1, C = 1): Opacus's per-sample gradients on the GPU.

The table gives each run's wall time, peak GPU memory, mean training time per round (round 1
left out: CUDA and cuDNN warm-up), that time over its baseline's, the mean server step time, and
the run's ε from results.json (δ = 1e-5). A run that fails does not stop the others: its error
line is in the table. A ``--tmp`` that holds an earlier call's runs is refused before anything
runs (nothing is removed). ``--smoke`` (tiny images, 2 rounds) checks the script on a CPU in minutes
(``--accelerator cpu --smoke`` with ``FEDMTL_RESULTS_DIR`` set). Recorded in
``benchmarks/results/gpu_privacy.md``; with ``$OUT`` set, copied there too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a test loads this file by path

import gpu_rounds  # noqa: E402
import results_file  # noqa: E402

NOISE = ["--privacy.noise_multiplier", "1.0", "--privacy.clip", "1.0", "--privacy.delta", "1e-5"]


# Central DP with every server-side option on: adaptive clipping, secure aggregation.
CENTRAL = (
    "--algorithm",
    "FedAvg",
    "--privacy.mode",
    "central",
    *NOISE,
    "--privacy.adaptive_clip.enabled",
    "true",
    "--privacy.adaptive_clip.count_stddev",  # above z/2, as adaptive clipping needs
    "1.0",
    "--secure_aggregation",
    "true",
)


@dataclass(frozen=True)
class Variant:
    name: str
    options: tuple[str, ...]
    precision: str = "32-true"
    baseline: str | None = None  # the variant without privacy it is compared with


VARIANTS = (
    Variant("FedAvg", ("--algorithm", "FedAvg")),
    Variant("FedAvg central+secagg", CENTRAL, baseline="FedAvg"),
    Variant("FedAvg central+secagg 16-mixed", CENTRAL, precision="16-mixed", baseline="FedAvg"),
    Variant("FedHCA2", ()),
    Variant(
        "FedHCA2 local",
        ("--privacy.mode", "local", "--privacy.noise_multiplier", "0.1", "--privacy.clip", "1.0"),
        baseline="FedHCA2",
    ),
    Variant("FedAvg group-norm", ("--algorithm", "FedAvg", "--model.norm", "group")),
    Variant(
        "FedAvg DP-SGD",
        ("--algorithm", "FedAvg", "--model.norm", "group", "--privacy.mode", "sample", *NOISE),
        baseline="FedAvg group-norm",
    ),
)


def slug(variant: Variant) -> str:
    """The variant's run directory and file name: letters, digits, '_' and '-' ($OUT returns it)."""
    return variant.name.replace(" ", "_").replace("+", "-")


def demo_options(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The demo's options shared by every variant (gpu_rounds.py's, with --rounds)."""
    args.rounds_demo, args.rounds_paper, args.only = args.rounds, 0, "demo"
    (demo,) = gpu_rounds.scenarios(args, tmp)
    return demo.options


def train_after_warmup(run: gpu_rounds.Run) -> float:
    """Mean time/train over the rounds after the first (all of them if there is one)."""
    rounds = sorted(run.times)
    later = [run.times[r]["train"] for r in rounds[1:] if "train" in run.times[r]]
    if not later:
        later = [run.times[r]["train"] for r in rounds if "train" in run.times[r]]
    return statistics.fmean(later) if later else math.nan


def mean_phase(run: gpu_rounds.Run, phase: str) -> float:
    values = [times[phase] for times in run.times.values() if phase in times]
    return statistics.fmean(values) if values else math.nan


def epsilon(run: gpu_rounds.Run) -> str:
    path = run.run_dir / "results.json"
    if not path.is_file():
        return "-"
    privacy = json.loads(path.read_text()).get("privacy")
    if not privacy:
        return "—"
    value = privacy.get("epsilon")
    return "∞" if value is None else f"{value:.3g}"


def report(runs: dict[Variant, gpu_rounds.Run], data: str, args: argparse.Namespace) -> str:
    import lightning
    import torch

    device = gpu_rounds.cuda()
    if device is not None:
        name = f"{device.get_device_name(0)} (CUDA {torch.version.cuda}, {device.device_count()} visible)"
    else:
        name = f"no CUDA device: {args.accelerator} ({platform.processor() or platform.machine()})"
    by_name = {variant.name: run for variant, run in runs.items()}
    lines = [
        f"- device: {name}",
        f"- torch {torch.__version__}, lightning {lightning.__version__}, Python {platform.python_version()}",
        f"- the demo, {args.rounds} rounds"
        + (" (--smoke: tiny images, for a CPU check only)" if args.smoke else "")
        + f"; data written in {data} s before the first run",
        "",
        "Each run is `fedmtl fit --config configs/demo.yaml` in this process, in this order, with "
        f"`--accelerator {args.accelerator} --logger.wandb false` and a fresh run directory. "
        "train (s): mean time/train per round, round 1 left out (warm-up); ÷ baseline: that over "
        "the same run without privacy. aggregate (s): mean server step per round. Peak memory: "
        "torch.cuda.max_memory_allocated / max_memory_reserved over the run. ε at δ = 1e-5 from "
        "results.json (— for a run without privacy).",
        "",
        results_file.table_head(
            "run",
            "status",
            "precision",
            "wall (s)",
            "peak alloc (GiB)",
            "peak reserved (GiB)",
            "train (s)",
            "÷ baseline",
            "aggregate (s)",
            "ε",
            labels=3,
        ),
    ]
    for variant, run in runs.items():
        train = train_after_warmup(run)
        base = by_name.get(variant.baseline) if variant.baseline else None
        ratio = train / train_after_warmup(base) if base is not None else math.nan
        lines.append(
            results_file.row(
                variant.name,
                run.status,
                variant.precision,
                gpu_rounds.fmt(run.wall, 1),
                gpu_rounds.fmt(run.peak_allocated),
                gpu_rounds.fmt(run.peak_reserved),
                gpu_rounds.fmt(train),
                gpu_rounds.fmt(ratio),
                gpu_rounds.fmt(mean_phase(run, "aggregate")),
                epsilon(run),
            )
        )
    failed = [(variant, run) for variant, run in runs.items() if run.error]
    if failed:
        lines += ["", "Errors:", ""] + [f"- {variant.name}: `{run.error}`" for variant, run in failed]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each run")
    parser.add_argument("--accelerator", default="gpu", help="gpu; cpu for a smoke test")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and 2 rounds: a CPU check")
    parser.add_argument("--tmp", type=Path, required=True, help="folder for the data and run directories")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds = 2
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    os.chdir(gpu_rounds.ROOT)  # configs/demo.yaml and the commit are this checkout's
    tmp = args.tmp.resolve()
    options = demo_options(args, tmp)
    configs = ["configs/demo.yaml"]
    gpu_rounds.refuse_earlier_runs(parser, tmp, [tmp / "privacy" / slug(variant) for variant in VARIANTS])
    data = gpu_rounds.prepare_data(gpu_rounds.Scenario("demo", configs, options))
    runs: dict[Variant, gpu_rounds.Run] = {}
    for variant in VARIANTS:
        scenario = gpu_rounds.Scenario(variant.name, configs, [*options, *variant.options])
        run = gpu_rounds.Run(slug(variant), scenario, variant.precision, tmp / "privacy" / slug(variant))
        runs[variant] = run
        gpu_rounds.execute(run)
        gpu_rounds.read_times(run)
    body = report(runs, data, args)
    print(body, flush=True)
    path = results_file.record("gpu_privacy", "The privacy modes on one GPU", body)
    gpu_rounds.copy_out(path, list(runs.values()))
    return 0 if all(run.status == "ok" for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
