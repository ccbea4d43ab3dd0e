"""How well can a model score on PASCAL-Context edges at a given image size, and Sobel?

    python benchmarks/edge_ceiling.py --sizes 32 64 96

A model learns the *training* edge label (the thinned Laplacian of the LabelMap) and is scored
against the *validation* one (BSDS ``seg2bmap``, one pixel to one side of the boundary) within
0.0075 x the image diagonal (REFERENCE.md, "Metrics"): 0.34 px at 32x32, 0.68 px at 64x64,
1.02 px at 96x96. This prints, per size, the odsF of a model that predicted the training label
perfectly (the ceiling of what learning can reach) and of Sobel edges (the trivial predictor
a learnt model must beat), on the generated validation images.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


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

    print("| size | tolerance (px) | ceiling odsF | Sobel odsF |")
    print("| ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            ceiling, sobel = scores(size, args.num_val, Path(tmp))
            print(
                f"| {size} | {EDGE_MAX_DIST['pascal_context'] * size * 2**0.5:.2f} | {ceiling:.1f} | {sobel:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
