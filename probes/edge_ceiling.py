"""How well can a model score on PASCAL-Context edges at a given image size, and Sobel?

    python probes/edge_ceiling.py --sizes 32 64 96

A model learns the *training* edge label (the thinned Laplacian of the LabelMap) and is scored
against the *validation* one (BSDS ``seg2bmap``, one pixel to one side of the boundary) within
0.0075 x the image diagonal (docs/evaluation.md, "The metrics"): 0.34 px at 32x32, 0.68 px at 64x64,
1.02 px at 96x96. This prints, per size, the odsF of a model that predicted the training label
perfectly (the ceiling of what learning can reach) and of Sobel edges (the trivial predictor
a learnt model must beat), on the generated validation images. The table is recorded in
``probes/results/edge_ceiling.md`` by ``benchmarks/results_file.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' recorder
import results_file  # noqa: E402


def scores(size: int, num_val: int, root: Path) -> tuple[float, float]:
    """(ceiling, Sobel) edge odsF on ``num_val`` generated validation images of ``size``²."""
    import torch

    from fedmtl.data.datasets import build_dataset
    from fedmtl.data.pascal_context import PascalContext, label_boundaries
    from fedmtl.synth import generate
    from fedmtl.tasks import get_task
    from fedmtl.trivial import sobel_edges

    folder = generate("pascal_context", root / f"{size}", num_train=1, num_val=num_val, size=(size, size))
    val = build_dataset("pascal_context", folder, "val", ["edge"], (size, size), augment=False)
    target = torch.stack([val[i]["edge"] for i in range(len(val))])
    images = torch.stack([val[i]["image"] for i in range(len(val))])

    class TrainLabels(PascalContext):  # the validation images with the training split's edge label
        def edge_label(self, label_map):
            return label_boundaries(label_map)

    as_trained = TrainLabels(folder, split="val", tasks=["edge"], transform=val.transform)
    ceiling_pred = torch.stack([as_trained[i]["edge"] for i in range(len(as_trained))])
    out = []
    for pred in (ceiling_pred, sobel_edges(images)):
        metric = get_task("edge").metric("pascal_context")
        metric.update(pred, target)
        out.append(float(metric.compute()))
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 96])
    parser.add_argument("--num_val", type=int, default=60)
    args = parser.parse_args(argv)
    if min(args.sizes) < 32 or args.num_val < 1:
        parser.error("--sizes must be at least 32 (the encoder's stride) and --num_val at least 1")
    from fedmtl.tasks import EDGE_MAX_DIST

    lines = [
        f"PASCAL-Context edge odsF on {args.num_val} generated validation images per size: a perfect "
        "prediction of the training label (the ceiling of what learning can reach) and Sobel edges "
        "(the trivial predictor), scored against the validation label within the tolerance.",
        "",
        results_file.table_head("size", "tolerance (px)", "ceiling odsF", "Sobel odsF", labels=0),
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            ceiling, sobel = scores(size, args.num_val, Path(tmp))
            tolerance = EDGE_MAX_DIST["pascal_context"] * size * 2**0.5
            lines.append(results_file.row(size, f"{tolerance:.2f}", f"{ceiling:.1f}", f"{sobel:.1f}"))
            print(lines[-1], flush=True)
    results_file.record(
        "edge_ceiling",
        "Edge odsF ceiling and Sobel per image size",
        "\n".join(lines),
        folder=results_file.PROBES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
