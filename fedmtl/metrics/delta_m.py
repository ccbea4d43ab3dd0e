"""Δm: the mean relative gain over all tasks against a baseline, in %.

docs/evaluation.md, "Δm": Δm = (1/T) Σ_t (−1)^{l_t} (M_t − M_base,t) / M_base,t × 100, with
l_t = 1 where lower is better (normals, depth), over all tasks of all clients, baseline = local
training. It reproduces the Δm column of the paper's Tables 1 and 2 to two decimals.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def delta_m(
    results: Mapping[str, float], baseline: Mapping[str, float], lower_is_better: Collection[str]
) -> float:
    """Δm in % of ``results`` against ``baseline``; both map metric name -> value (same names).

    ``lower_is_better`` names the metrics where a decrease is a gain (e.g. "nyud/depth").
    Values may be python numbers or 0-d tensors.
    """
    if isinstance(lower_is_better, str):
        raise TypeError("lower_is_better must be a collection of metric names, not a single string")
    missing, extra = baseline.keys() - results.keys(), results.keys() - baseline.keys()
    if missing or extra:
        raise ValueError(
            "results and baseline must name the same metrics: "
            f"missing from results {sorted(missing)}, not in baseline {sorted(extra)}"
        )
    unknown = set(lower_is_better) - baseline.keys()
    if unknown:
        raise ValueError(f"lower_is_better names metrics that are not in the results: {sorted(unknown)}")
    if not baseline:
        raise ValueError("delta_m needs at least one metric")

    total = 0.0
    for name, base in baseline.items():
        base = float(base)
        if base == 0:
            raise ValueError(f"baseline value of {name!r} is 0: the relative change is undefined")
        sign = -1.0 if name in lower_is_better else 1.0
        total += sign * (float(results[name]) - base) / base
    return total / len(baseline) * 100
