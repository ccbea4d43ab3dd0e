"""The same training work over more and more clients: peak memory, round time, bytes written.

    .venv/bin/python benchmarks/scale.py [--replicas 4 34 334] [--methods FedAvg FedHCA2]
        [--participation 1.0 0.1] [--stores disk] [--aggregation auto]
        [--tiny-replicas 34 3334] [--tiny-participation 0.01] [--tiny-images 2] [--tiny-batch 2]
        [--data data/scale] [--tmp DIR] [--disk-mib 2048] [--out scale]

The probe of issues #27 and #35: a single-task PASCAL-Context group (semseg, normals: one client
per task) and a multi-task NYUD-v2 group (semseg, depth) at 32×32 with the default backbone, one
round, ``replicas`` R of each client, so 3R clients, always on the same 5,344 PASCAL-Context and
2,672 NYUD-v2 training images (generated once under ``--data``), batch 8: 8 a client at R = 334
(1,002 clients), 668 at R = 4 (12 clients). FedHCA² needs every client in every round, so it
runs at participation 1 only; participation below 1 is skipped at the smallest R, the baseline
of the targets.

The tiny rows (``--tiny-replicas``, FedAvg): clients of ``--tiny-images`` training images each
(2) and batch ``--tiny-batch`` (2), so the data grows with the clients: 2 × 2R PASCAL-Context and
2 × R NYUD-v2 images, generated once per size under ``--data/IMAGES-images-CLIENTS-clients``.
The smallest tiny R (34: 102 clients) runs at participation 1, the baseline; every larger one
(3,334: 10,002 clients) at each ``--tiny-participation`` (0.01). ``--tiny-replicas`` without a
number (or ``--replicas`` without one) leaves those rows out.

Each run is a fresh ``fedmtl fit`` process (one CPU thread), the data generated beforehand. Its
peak resident set size comes from the OS; the bytes it wrote (``wchar``: bytes passed to
write(); ``write_bytes``: bytes it sent, or dirtied for, the storage layer, mapped writes
included) from ``/proc/PID/io``, polled every 0.2 s and read once more when it has exited,
before it is reaped; its phase times from its metrics.csv ``time/*`` values, whichever the
engine logs. The state bytes of a client are read from the run's checkpoint before the run
directory is removed.

Printed and written to ``benchmarks/results/OUT.md`` (``$FEDMTL_RESULTS_DIR/OUT.md`` when set):
the disk's write (fsync) and read speed, from one ``--disk-mib`` MiB file; per run, peak RSS,
wall time, the round (wall minus ``time/eval``: the final evaluation covers every client, so it
is compared per client evaluated), training time per sample trained, the phase times, the bytes
written per round and their ratio to the state bytes of the clients that trained
(participation × clients, at least one); then issue #35's targets, each with its ratio
(measured over allowed: at most 1.00 meets it):

- the largest R, participation 1, each method: round ≤ 1.3 × the smallest R's round + the time
  to write and read its clients' states once at the disk speed; eval per client ≤ 1.3 × the
  smallest R's; peak RSS ≤ 4 GB;
- the largest R, participation below 1: round ≤ 0.25 × the same clients' participation-1 round;
- each larger tiny R: peak RSS ≤ 4 GB; round ≤ 1.5 × the tiny baseline's round; eval per
  client ≤ 1.3 × the tiny baseline's;
- every run: bytes written per round ≤ 1.1 × the state bytes of the clients that trained.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results_file
import yaml

ROOT = Path(__file__).resolve().parent.parent
PASCAL_IMAGES, NYUD_IMAGES = 5344, 2672
NUM_VAL, SIZE = 16, [32, 32]
FOLDERS = {"pascal_context": "PASCALContext", "nyud": "NYUDv2"}  # each dataset's folder under data.root
RSS_LIMIT = 4e9  # bytes: the 4 GB
#: The phases in the order the engine runs them; any other ``time/*`` value follows, by name.
PHASES = ("train", "exchange", "aggregate", "write_back", "eval")
#: The table's columns (the phase times' header names the phases) and their alignment.
COLUMNS = (
    "method", "clients", "images per client", "participation", "store", "peak RSS", "wall", "round",
    "eval per client", "train per sample", "phase times", "written per round: wchar / write_bytes",
    "written / trained states (≤ 1.1)",
)  # fmt: skip
ALIGN = ("---", "---:", "---:", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---", "---:", "---:")

# Runs ``argv`` and prints, as JSON, its peak RSS (KiB), exit status and the write counters of
# /proc/PID/io: polled every 0.2 s, then read once more after it exits but before it is reaped
# (waitid WNOWAIT: a zombie's counters are final); the last reading that succeeded counts.
_MEASURE = """
import json, os, resource, subprocess, sys, tempfile, time

def io(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f if ": " in line)}
    except (OSError, ValueError):
        return None

with tempfile.TemporaryFile("w+") as err:
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=err, text=True)
    last = None
    while True:
        if hasattr(os, "waitid"):
            exited = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        else:
            exited = child.poll() is not None
        last = io(child.pid) or last
        if exited:
            break
        time.sleep(0.2)
    code = child.wait()
    if code:
        err.seek(0)
        sys.stderr.write(err.read()[-3000:])
last = last or {}
print(json.dumps({
    "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    "returncode": code,
    "wchar": last.get("wchar"),
    "write_bytes": last.get("write_bytes"),
}))
"""


def image_counts(replicas: int, images_per_client: int | None) -> tuple[int, int]:
    """(PASCAL-Context, NYUD-v2) training images: the fixed probe's, or ``images_per_client``
    for each of the 2R single-task PASCAL-Context clients and the R NYUD-v2 clients."""
    if images_per_client is None:
        return PASCAL_IMAGES, NYUD_IMAGES
    return images_per_client * 2 * replicas, images_per_client * replicas


def probe_config(
    data: Path,
    replicas: int,
    method: str,
    participation: float,
    images_per_client: int | None = None,
    batch: int = 8,
) -> dict:
    algorithm = {"class_path": method}
    if participation < 1:
        algorithm["init_args"] = {"participation": participation}
    pascal, nyud = image_counts(replicas, images_per_client)
    return {
        "clients": [
            {
                "dataset": "pascal_context",
                "tasks": ["semseg", "normals"],
                "single_task": True,
                "replicas": replicas,
                "batch_size": batch,
            },
            {"dataset": "nyud", "tasks": ["semseg", "depth"], "replicas": replicas, "batch_size": batch},
        ],
        "algorithm": algorithm,
        "data": {
            "root": str(data),
            "train_size": SIZE,
            "synth": {
                "pascal_context": {"num_train": pascal, "num_val": NUM_VAL, "size": SIZE},
                "nyud": {"num_train": nyud, "num_val": NUM_VAL, "size": SIZE},
            },
        },
        "evaluation": {"every": 0},
        "rounds": 1,
        "accelerator": "cpu",
        "cpu_threads": 1,
        "checkpoint_every": 0,
        "logger": {"wandb": False},
    }


def data_root(data: Path, replicas: int, images_per_client: int | None) -> Path:
    """Where a run's data is: ``data`` for the fixed probe, a folder per size for the tiny rows."""
    if images_per_client is None:
        return data
    return data / f"{images_per_client}-images-{3 * replicas}-clients"


def ensure_data(root: Path, replicas: int, images_per_client: int | None) -> None:
    """Generate the datasets under ``root`` that are missing, before a run is timed (a run would
    generate them itself, inside its wall time)."""
    for dataset, count in zip(FOLDERS, image_counts(replicas, images_per_client), strict=True):
        folder = root / FOLDERS[dataset]
        if folder.is_dir():
            continue
        print(f"generating {count} {dataset} training images in {folder}", flush=True)
        command = [sys.executable, "-m", "fedmtl", "data", "synth", "--dataset", dataset]
        command += ["--root", str(folder), "--num_train", str(count), "--num_val", str(NUM_VAL)]
        command += ["--size", json.dumps(SIZE)]
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def client_state_bytes(checkpoints: Path) -> dict[str, int]:
    """Each stored client's state bytes in ``checkpoints``: its parameters' file, apart its
    optimiser state's (client_N.optim.pt) and, where the store left its encoder in the round's
    "trained" row, that row's file (rows_rNNNN_client_N.trained.f32). A client that never
    trained has none (it is drawn again from the seed)."""
    sizes: dict[str, int] = {}
    for folder in checkpoints.glob("round_*"):
        for path in (*folder.glob("client_*.pt"), *folder.glob("rows_*.trained.f32")):
            client = "client_" + path.name.split("client_")[1].split(".")[0]
            sizes[client] = sizes.get(client, 0) + path.stat().st_size
    return sizes


def run(
    args: argparse.Namespace,
    tmp: Path,
    replicas: int,
    method: str,
    participation: float,
    store: str,
    images_per_client: int | None = None,
    batch: int = 8,
) -> dict:
    tiny = images_per_client is not None
    data = data_root(args.data, replicas, images_per_client)
    ensure_data(data, replicas, images_per_client)
    kind = f"{images_per_client}img" if tiny else "fixed"
    run_dir = tmp / f"run-{method}-{replicas}-{participation}-{store}-{kind}"
    config = tmp / f"{run_dir.name}.yaml"
    config.write_text(
        yaml.safe_dump(probe_config(data, replicas, method, participation, images_per_client, batch))
    )
    command = [sys.executable, "-m", "fedmtl", "fit", "--config", str(config), "--run_dir", str(run_dir)]
    command += ["--store", store, "--aggregation", args.aggregation]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True, check=True, cwd=ROOT
    )
    wall = time.perf_counter() - start
    measured = json.loads(done.stdout.splitlines()[-1])
    if measured["returncode"] != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    with open(run_dir / "metrics.csv") as f:
        values = {row["key"]: float(row["value"]) for row in csv.DictReader(f)}
    sizes = client_state_bytes(run_dir / "checkpoints")
    clients = len(json.loads((run_dir / "results.json").read_text())["clients"])
    # A client's state: the mean over the checkpoint's stored clients (one round)
    state = sum(sizes.values()) / len(sizes) if sizes else 0.0
    shutil.rmtree(run_dir)
    # Method.participants: round(participation × clients) of them, at least one
    trained = max(1, round(participation * clients)) if participation < 1 else clients
    images = sum(image_counts(replicas, images_per_client))
    times = {k[5:]: v for k, v in values.items() if k.startswith("time/")}
    return {
        "method": method,
        "replicas": replicas,
        "tiny": tiny,
        "clients": clients,
        "images_per_client": images / clients,
        "batch": batch,
        "participation": participation,
        "store": store,
        "rss_bytes": measured["maxrss_kib"] * 1024,
        "rss_gib": measured["maxrss_kib"] / 2**20,
        "wall": wall,
        "round": wall - times.get("eval", 0.0),
        "eval_per_client": times["eval"] / clients if "eval" in times else None,
        "ms_per_sample": 1000 * times.get("train", 0.0) / (images * trained / clients),
        "times": times,
        "state_bytes": state * clients,
        "trained": trained,
        "trained_state_bytes": state * trained,
        "wchar": measured["wchar"],
        "write_bytes": measured["write_bytes"],
    }


def disk_speed(folder: Path, size: int = 2**31) -> tuple[float, float]:
    """(write, read) bytes per second of one ``size``-byte file in ``folder``; the write is
    fsynced, the read may come from the page cache."""
    path = folder / "disk-speed.bin"
    block = os.urandom(min(size, 2**24))
    size -= size % len(block)  # whole blocks
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    write = size / (time.perf_counter() - start)
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(2**24):
            pass
    read = size / (time.perf_counter() - start)
    path.unlink()
    return write, read


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="*", default=[4, 34, 334])
    parser.add_argument("--methods", nargs="+", default=["FedAvg", "FedHCA2"])
    parser.add_argument("--participation", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--stores", nargs="+", default=["disk"])
    parser.add_argument("--aggregation", default="auto", choices=["auto", "stacked", "streamed"])
    parser.add_argument(
        "--tiny-replicas",
        type=int,
        nargs="*",
        default=[34, 3334],
        help="replicas of the tiny FedAvg rows; the smallest runs at participation 1 (none: no tiny rows)",
    )
    parser.add_argument(
        "--tiny-participation",
        type=float,
        nargs="+",
        default=[0.01],
        help="the participation of the tiny rows above the smallest",
    )
    parser.add_argument("--tiny-images", type=int, default=2, help="training images per tiny client")
    parser.add_argument("--tiny-batch", type=int, default=2, help="batch size of the tiny clients")
    parser.add_argument(
        "--data", type=Path, default=ROOT / "data" / "scale", help="the probe's generated data"
    )
    parser.add_argument(
        "--tmp", type=Path, default=None, help="where the runs go (default: a temporary folder)"
    )
    parser.add_argument("--disk-mib", type=int, default=2048, help="size of the disk-speed test file")
    parser.add_argument("--out", default="scale", help="benchmarks/results/OUT.md")
    args = parser.parse_args(argv)
    for name in ("replicas", "tiny_replicas"):
        if any(r < 1 for r in getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("participation", "tiny_participation"):
        if any(not 0 < p <= 1 for p in getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(args, name)}")
    if args.tiny_images < 1:
        parser.error(f"--tiny-images must be at least 1, got {args.tiny_images}")
    if not 1 <= args.tiny_batch <= args.tiny_images:
        parser.error(
            f"--tiny-batch must be between 1 and --tiny-images {args.tiny_images}, got {args.tiny_batch}"
        )
    if args.disk_mib < 1:
        parser.error(f"--disk-mib must be at least 1, got {args.disk_mib}")
    if not args.replicas and not args.tiny_replicas:
        parser.error("--replicas and --tiny-replicas are both empty: nothing to run")
    args.data = args.data.resolve()
    return args


def plan(args: argparse.Namespace) -> list[tuple[int, str, float, str, int | None, int]]:
    """The runs, in order: (replicas, method, participation, store, images per client, batch)."""
    runs = []
    for method in args.methods:
        for replicas in args.replicas:
            for participation in args.participation:
                if participation < 1 and (method == "FedHCA2" or replicas == min(args.replicas)):
                    continue  # FedHCA² takes every client; the baseline is participation 1
                runs += [(replicas, method, participation, store, None, 8) for store in args.stores]
    for replicas in sorted(set(args.tiny_replicas)):
        for participation in [1.0] if replicas == min(args.tiny_replicas) else args.tiny_participation:
            runs += [
                (replicas, "FedAvg", participation, store, args.tiny_images, args.tiny_batch)
                for store in args.stores
            ]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    title = "Scale: the same training work over more clients"
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp_name:
        tmp = Path(tmp_name)
        write, read = disk_speed(tmp, args.disk_mib * 2**20)
        print(f"disk: write {write / 2**20:.0f} MiB/s (fsync), read {read / 2**20:.0f} MiB/s", flush=True)
        for replicas, method, participation, store, images, batch in plan(args):
            r = run(args, tmp, replicas, method, participation, store, images, batch)
            results.append(r)
            print(_line(r), flush=True)
            # After every run: a failure later keeps what was measured
            body = table(results, write, read, args.disk_mib)
            path = results_file.write(args.out, title, body)
    print(body)
    print(f"written: {path}")
    return 0


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f}"


def written(r: dict) -> float | None:
    """Bytes written per round (one round here): the larger of ``wchar`` and ``write_bytes``."""
    counts = [n for n in (r["wchar"], r["write_bytes"]) if n is not None]
    return max(counts) if counts else None


def written_ratio(r: dict) -> float | None:
    """Bytes written per round over the state bytes of the clients that trained."""
    n = written(r)
    return n / r["trained_state_bytes"] if n is not None and r["trained_state_bytes"] else None


def _verdict(ratio: float | None, limit: float = 1.0) -> str:
    return "n/a" if ratio is None else ("met" if ratio <= limit else "not met")


def _label(r: dict) -> str:
    return (
        f"{r['method']}, {r['clients']} clients ({r['images_per_client']:.0f} images each, batch {r['batch']}), "
        f"participation {r['participation']:g}, store {r['store']}"
    )


def _line(r: dict) -> str:
    times = ", ".join(f"{k} {v:.1f} s" for k, v in _ordered(r["times"]))
    ratio = written_ratio(r)
    return (
        f"{_label(r)}: peak RSS {r['rss_gib']:.2f} GiB, wall {r['wall']:.0f} s, round {r['round']:.0f} s, "
        f"{r['ms_per_sample']:.1f} ms per sample ({times}); written wchar {_mib(r['wchar'])} MiB, "
        f"write_bytes {_mib(r['write_bytes'])} MiB, "
        + ("n/a" if ratio is None else f"{ratio:.2f}")
        + f" × the {r['trained']} trained states"
    )


def phase_names(results: list[dict]) -> list[str]:
    """The ``time/*`` phases any run logged: :data:`PHASES` first, in order, then the others by name."""
    logged = {k for r in results for k in r["times"]}
    return [p for p in PHASES if p in logged] + sorted(logged - set(PHASES))


def _ordered(times: dict[str, float]) -> list[tuple[str, float]]:
    return [(k, times[k]) for k in phase_names([{"times": times}])]


def _seconds(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms" if x < 1 else f"{x:.1f} s"


def table(results: list[dict], write: float, read: float, disk_mib: int = 2048) -> str:
    """The results file's body: the disk, the table of runs, the targets."""
    phases = phase_names(results)
    lines = [
        f"Disk: write {write / 2**20:.0f} MiB/s (fsync), read {read / 2**20:.0f} MiB/s ({disk_mib} MiB "
        "file; the read may come from the page cache).",
        "",
        results_file.row(*COLUMNS[:-3], " / ".join(phases) + " (s)", *COLUMNS[-2:]),
        results_file.row(*ALIGN),
    ]
    for r in results:
        ratio = written_ratio(r)
        lines.append(
            results_file.row(
                r["method"],
                r["clients"],
                f"{r['images_per_client']:.0f}",
                f"{r['participation']:g}",
                r["store"],
                f"{r['rss_gib']:.2f} GiB",
                f"{r['wall']:.0f} s",
                f"{r['round']:.0f} s",
                _seconds(r["eval_per_client"]),
                f"{r['ms_per_sample']:.1f} ms",
                " / ".join(f"{r['times'][p]:.1f}" if p in r["times"] else "–" for p in phases),
                f"{_mib(r['wchar'])} / {_mib(r['write_bytes'])} MiB",
                "n/a" if ratio is None else f"{ratio:.2f}, {_verdict(ratio, 1.1)}",
            )
        )
    lines += [
        "",
        "Round: wall time minus `time/eval` (the final evaluation, over every client: eval per client "
        "is `time/eval` over the clients evaluated). Written per round: `wchar` (bytes passed to write()) "
        "and `write_bytes` (bytes sent to the storage layer) of the fit process from /proc/PID/io, over "
        "its one round, setup and final checkpoint included; the ratio takes the larger over the state "
        "bytes (read from the checkpoint) of the clients that trained.",
        "",
        "Targets (issue #35), each as measured over allowed (at most 1.00 meets it):",
        "",
        *targets(results, write, read),
    ]
    return "\n".join(lines)


def targets(results: list[dict], write: float, read: float) -> list[str]:
    """Issue #35's targets, one line each: the text, the ratio, met or not met."""
    out: list[str] = []

    def find(tiny: bool, method: str, store: str, participation: float, replicas: int) -> dict | None:
        return next(
            (
                b
                for b in results
                if (b["tiny"], b["method"], b["store"], b["participation"], b["replicas"])
                == (tiny, method, store, participation, replicas)
            ),
            None,
        )

    def line(r: dict, text: str, measured: float | None, allowed: float | None) -> None:
        ratio = measured / allowed if measured is not None and allowed else None
        shown = "n/a" if ratio is None else f"{ratio:.2f}"
        out.append(f"- {_label(r)}: {text}: {shown}, {_verdict(ratio)}")

    def rss(r: dict) -> None:
        line(r, f"peak RSS {r['rss_bytes'] / 1e9:.2f} GB ≤ 4 GB", r["rss_bytes"], RSS_LIMIT)

    def eval_per_client(r: dict, base: dict, times: float) -> None:
        if r["eval_per_client"] is None or base["eval_per_client"] is None:
            return line(r, "eval per client: no time/eval", None, None)
        allowed = times * base["eval_per_client"]
        text = (
            f"eval per client {_seconds(r['eval_per_client'])} ≤ {times:g} × {base['clients']} clients' "
            f"{_seconds(base['eval_per_client'])} = {_seconds(allowed)}"
        )
        line(r, text, r["eval_per_client"], allowed)

    for tiny in (False, True):
        runs = [r for r in results if r["tiny"] == tiny]
        if not runs:
            continue
        low, high = min(r["replicas"] for r in runs), max(r["replicas"] for r in runs)
        for r in runs:
            if r["replicas"] == low or (not tiny and r["replicas"] != high):
                continue
            if tiny:
                base = find(True, r["method"], r["store"], 1.0, low)
                rss(r)
                if base is not None:
                    allowed = 1.5 * base["round"]
                    text = (
                        f"round {r['round']:.0f} s ≤ 1.5 × {base['clients']} clients' {base['round']:.0f} s"
                    )
                    line(r, f"{text} = {allowed:.0f} s", r["round"], allowed)
                    eval_per_client(r, base, 1.3)
            elif r["participation"] == 1:
                base = find(False, r["method"], r["store"], 1.0, low)
                if base is not None:
                    io = r["state_bytes"] / write + r["state_bytes"] / read
                    allowed = 1.3 * base["round"] + io
                    text = (
                        f"round {r['round']:.0f} s ≤ 1.3 × {base['clients']} clients' {base['round']:.0f} s "
                        f"+ {io:.0f} s (its {r['state_bytes'] / 2**30:.2f} GiB of states written and read "
                        f"once) = {allowed:.0f} s"
                    )
                    line(r, text, r["round"], allowed)
                    eval_per_client(r, base, 1.3)
                rss(r)
            else:
                full = find(False, r["method"], r["store"], 1.0, r["replicas"])
                if full is not None:
                    allowed = 0.25 * full["round"]
                    text = f"round {r['round']:.0f} s ≤ 0.25 × participation 1's {full['round']:.0f} s = {allowed:.0f} s"
                    line(r, text, r["round"], allowed)
    ratios = [(written_ratio(r), r) for r in results if written_ratio(r) is not None]
    if ratios:
        met = sum(ratio <= 1.1 for ratio, _ in ratios)
        highest, r = max(ratios, key=lambda pair: pair[0])
        out.append(
            f"- every run: bytes written per round ≤ 1.1 × the state bytes of the clients that trained: "
            f"met by {met} of {len(ratios)} runs; the highest, {highest:.2f} × ({_label(r)}): "
            f"{highest / 1.1:.2f}, {_verdict(highest, 1.1)}"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
