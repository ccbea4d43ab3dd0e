"""Edge odsF per-image counts: the code path before issue #13 against the fast one.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/edge_eval.py [--repeats 5] [--threads 1]
        [--sizes 96x96 512x512] [--nms on off]

Times ``edge_image_counts`` (fedmtl/metrics/edge.py) against
``reference_edge_image_counts`` (tests/edge_reference.py, the earlier code: numpy
NMS, numpy thinning of every distinct map, a maximum flow per map) on one image per case, 99
thresholds, max_dist 0.0075 (PASCAL-Context), in turns after one warm-up each (the warm-up
also loads or compiles the numba kernels). Printed per case: the median of ``--repeats`` runs
of each and the ratio reference / fast measured in the same run. The counts of the two are
checked equal first. The table is recorded in ``benchmarks/results/edge_eval.md``
(results_file.py).

Images (seeded): the ground truth is the BSDS ``seg2bmap`` boundary of a map of smooth random
regions. "blurry": what a barely trained model gives, every pixel > 0.01 — sigmoid of the
ground truth blurred (σ = 2 px) plus smooth noise, squeezed into [0.012, 0.988]. "sharp": a
confident model, 0.9 on the true boundary, uniform noise in [0, 0.05) elsewhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/edge_reference.py

import numpy as np  # noqa: E402
import results_file  # noqa: E402
import torch  # noqa: E402
from methods import interleaved  # noqa: E402  (benchmarks/methods.py: the same turn-taking timer)
from scipy.ndimage import gaussian_filter  # noqa: E402

from fedmtl.data.pascal_context import seg2bmap  # noqa: E402
from fedmtl.metrics.edge import edge_image_counts, edge_thresholds, quantize_edge  # noqa: E402
from tests.edge_reference import reference_edge_image_counts  # noqa: E402

MAX_DIST = 0.0075


def ground_truth(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """[H, W] uint8 0/1: seg2bmap of the argmax of 5 smooth noise channels (blob-shaped regions)."""
    channels = gaussian_filter(rng.standard_normal((5, h, w)), sigma=(0, min(h, w) / 12, min(h, w) / 12))
    return seg2bmap(channels.argmax(axis=0)).astype(np.uint8)


def blurry(gt: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = gt.shape
    ridge = gaussian_filter(gt.astype(np.float64), 2.0)
    noise = gaussian_filter(rng.standard_normal((h, w)), max(h, w) / 24)
    logit = 3 * (ridge / ridge.max() - 0.3) + noise / noise.std()
    return 0.012 + 0.976 / (1 + np.exp(-logit))


def sharp(gt: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(0.9 * gt + 0.05 * rng.random(gt.shape), 0, 1)


def grey(prob: np.ndarray) -> np.ndarray:
    return quantize_edge(torch.from_numpy(prob.astype(np.float32))).numpy()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", nargs="+", default=["96x96", "512x512"], help="HxW")
    parser.add_argument("--nms", nargs="+", choices=["on", "off"], default=["on", "off"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    thresholds = edge_thresholds()
    lines = [
        f"Edge odsF counts of one image, {torch.get_num_threads()} thread(s) (OMP_NUM_THREADS="
        f"{os.environ['OMP_NUM_THREADS']}), 99 thresholds, max_dist {MAX_DIST}; median of {args.repeats} "
        "runs of each path taken in turns after one warm-up. Ratio: the earlier code's time "
        "(reference) over the fast path's, measured in this run (above 1: the fast path is faster).",
        "",
        results_file.table_head(
            "size", "prediction", "nms", "reference (ms)", "fast (ms)", "reference / fast", labels=3
        ),
    ]
    print("\n".join(lines), flush=True)
    for size in args.sizes:
        h, w = (int(v) for v in size.split("x"))
        rng = np.random.default_rng(0)
        gt = ground_truth(h, w, rng)
        for name, make in (("blurry", blurry), ("sharp", sharp)):
            pred = grey(make(gt, rng))
            for nms in args.nms:
                on = nms == "on"
                fast = edge_image_counts(pred, gt, thresholds, MAX_DIST, nms=on)
                if not np.array_equal(
                    fast, reference_edge_image_counts(pred, gt, thresholds, MAX_DIST, nms=on)
                ):
                    raise SystemExit(f"{size} {name} nms={nms}: the counts differ from the reference")

                def reference(p: np.ndarray = pred, g: np.ndarray = gt, o: bool = on) -> np.ndarray:
                    return reference_edge_image_counts(p, g, thresholds, MAX_DIST, nms=o)

                def fast(p: np.ndarray = pred, g: np.ndarray = gt, o: bool = on) -> np.ndarray:
                    return edge_image_counts(p, g, thresholds, MAX_DIST, nms=o)

                runs = interleaved({"reference": reference, "fast": fast}, args.repeats)
                ref, new = statistics.median(runs["reference"]), statistics.median(runs["fast"])
                lines.append(
                    results_file.row(
                        size, name, nms, f"{ref * 1e3:.1f}", f"{new * 1e3:.1f}", f"{ref / new:.1f}"
                    )
                )
                print(lines[-1], flush=True)
    results_file.record(
        "edge_eval", "Edge odsF counts: the fast path against the earlier code", "\n".join(lines)
    )


if __name__ == "__main__":
    main()
