"""FedHCA² aggregation cost at the paper's scale, against copying the encoder updates once.

    .venv/bin/python benchmarks/aggregation.py [--device cpu|cuda] [--dtype float32] [--repeats 7]

Scenario 1 shapes: 6 clients (5 single-task on PASCAL-Context, 1 multi-task on NYUD-v2 with
4 tasks), so K = 9 decoders; encoders are Swin-T (``features_only``, 512×512), decoders our
FCN decoder (embed_dim 96). Updates are 1e-3 × randn. The timed call is round 2 of FedHCA2
(default options), which steps the hyper weights α, β from round 1's Ũ and A and then
aggregates; the reference is ``deltas.clone()`` of the [N, P] encoder updates in the same
process, timed in turns with it. Times are the median (and min) of ``--repeats`` runs after
one warm-up; the ratio is what the script is for, absolute times vary with the machine. The
tables are recorded in ``benchmarks/results/aggregation.md`` (results_file.py).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import results_file
import torch

from fedmtl.aggregation import (
    ClientInfo,
    FlatLayout,
    RoundInput,
    conflict_averse_coefficients,
    cross_attention_update_flat,
    decoder_owners_of,
    gram_matrix,
)
from fedmtl.methods import FedHCA2
from fedmtl.models import FCNDecoder, create_encoder

CLIENTS = [
    *(
        ClientInfo(f"pascal_{task}", "pascal_context", (task,), 1)
        for task in ("semseg", "human_parts", "sal", "normals", "edge")
    ),
    ClientInfo("nyud_mt", "nyud", ("semseg", "normals", "edge", "depth"), 1),
]
CLEAR_REFS = Path("/proc/self/clear_refs")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _times(fn: Callable[[], object], device: torch.device, before: Callable[[], None]) -> float:
    """Seconds of one call of ``fn``; ``before`` runs untimed."""
    before()
    _sync(device)
    start = time.perf_counter()
    result = fn()
    _sync(device)
    seconds = time.perf_counter() - start
    del result
    return seconds


def _interleaved(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int,
    before: dict[str, Callable[[], None]],
) -> dict[str, list[float]]:
    """``repeats`` timings of each function, taken in turns after one warm-up of each, so that
    a noisy machine slows them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            seconds = _times(fn, device, before.get(name, lambda: None))
            if i:
                times[name].append(seconds)
    return times


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _peak_growth(fn: Callable[[], object], device: torch.device) -> tuple[int, str]:
    """Peak memory the call adds on top of what is live before it, in bytes, and the method."""
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = fn()
        _sync(device)
        del result
        peak = torch.cuda.max_memory_allocated(device)
        return peak - base, "torch.cuda.max_memory_allocated − memory allocated before"
    base = _rss()
    try:  # Linux: writing 5 to clear_refs resets the kernel's peak RSS (VmHWM) to the current RSS
        CLEAR_REFS.write_text("5")
        result = fn()
        peak = _hwm()
        del result
        return peak - base, "process peak RSS (VmHWM, reset via /proc/self/clear_refs) − RSS before"
    except OSError:
        pass
    peak, done = base, threading.Event()  # elsewhere: sample RSS every 0.2 ms while the call runs

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss())
            time.sleep(2e-4)

    thread = threading.Thread(target=sample)
    thread.start()
    result = fn()
    done.set()
    thread.join()
    del result
    return peak - base, "process RSS sampled every 0.2 ms − RSS before (may miss short peaks)"


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)

    encoder = create_encoder("swin_t", img_size=(512, 512))
    decoder = FCNDecoder(encoder.channels, 96)
    enc_layout, dec_layout = FlatLayout.from_module(encoder), FlatLayout.from_module(decoder)
    owners = decoder_owners_of(CLIENTS)
    n, k, p, q = len(CLIENTS), len(owners), enc_layout.numel, dec_layout.numel
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return 1e-3 * torch.randn(*shape, generator=g, device=device, dtype=dtype)

    def round_input(r: int, enc_prev: torch.Tensor, dec_prev: torch.Tensor) -> RoundInput:
        return RoundInput(
            r, CLIENTS, enc_layout, enc_prev, randn(n, p), dec_layout, owners, dec_prev, randn(k, q)
        )

    enc_prev = enc_layout.flatten(encoder, dtype).to(device).repeat(n, 1)
    dec_prev = dec_layout.flatten(decoder, dtype).to(device).repeat(k, 1)
    del encoder, decoder
    aggregator = FedHCA2()
    first = round_input(1, enc_prev, dec_prev)
    out = aggregator.aggregate(first)
    del first, enc_prev, dec_prev
    after_round_1 = aggregator.state_dict()
    second = round_input(2, out.encoders, out.decoders)
    del out
    input_bytes = sum(
        t.numel() * t.element_size()
        for t in (second.encoders_prev, second.encoder_deltas, second.decoders_prev, second.decoder_deltas)
    )

    def reset() -> None:
        aggregator.load_state_dict(after_round_1)

    deltas = second.encoder_deltas
    timed = _interleaved(
        {"copy": deltas.clone, "fedhca2": lambda: aggregator.aggregate(second)},
        device,
        args.repeats,
        {"fedhca2": reset},
    )
    reset()
    peak, method = _peak_growth(lambda: aggregator.aggregate(second), device)
    copy_peak, _ = _peak_growth(deltas.clone, device)

    # Where the time goes (each part alone, same inputs).
    blocks = [deltas, after_round_1["encoder_update"].to(device)[None]]
    gram = gram_matrix(blocks).cpu()
    coefficients = conflict_averse_coefficients(gram[:n, :n]).to(device, dtype)
    mixing = torch.rand(n, n, dtype=dtype, device=device)
    parts = {
        "Gram D Dᵀ and ⟨Δ_i, Ũ^(1)⟩ (float64)": lambda: gram_matrix(blocks),
        "N×N simplex problem (CPU)": lambda: conflict_averse_coefficients(gram[:n, :n]),
        "Ũ = vᵀD": lambda: coefficients @ deltas,
        "θ_i = prev_i + Σ_j W_ij Δ_j (one addmm)": lambda: torch.addmm(second.encoders_prev, mixing, deltas),
        "decoder cross-attention A (K = 9)": lambda: cross_attention_update_flat(
            second.decoder_deltas, dec_layout
        ),
    }

    gib = 1024**3
    med, low = statistics.median, min
    part_times = _interleaved({"copy": deltas.clone, **parts}, device, args.repeats, {})
    part_copy = part_times.pop("copy")

    def timing(name: str, values: list[float], copy: list[float]) -> str:
        cells = (med(values) * 1e3, low(values) * 1e3, med(values) / med(copy), low(values) / low(copy))
        return results_file.row(name, *(f"{c:.1f}" for c in cells[:2]), *(f"{c:.2f}" for c in cells[2:]))

    head = results_file.table_head("call", "median (ms)", "min (ms)", "× copy", "× copy, of the mins")
    kept = input_bytes / 2 + (p + k * q) * deltas.element_size()
    lines = [
        f"FedHCA2 round 2 (hyper-weight step + aggregation), scenario 1: N = {n} clients, K = {k} decoders, "
        f"P = {p / 1e6:.1f} M encoder and Q = {q / 1e3:.1f} k decoder parameters, {args.dtype} on {device}, "
        f"{torch.get_num_threads()} CPU threads; inputs (θ^(r-1) and Δ of encoders and decoders) "
        f"{input_bytes / gib:.2f} GiB. Times: median and min of {args.repeats} calls taken in turns after "
        "one warm-up. Ratio: against `deltas.clone()` of the [N, P] encoder updates in the same turns "
        "(of the medians, and of the mins).",
        "",
        head,
        timing("deltas.clone() of the [N, P] encoder updates", timed["copy"], timed["copy"]),
        timing("FedHCA2.aggregate, round 2", timed["fedhca2"], timed["copy"]),
        "",
        "Its parts, each alone, timed in turns with another copy:",
        "",
        head,
        *(timing(name, values, part_copy) for name, values in part_times.items()),
        "",
        f"Peak memory added by the call: {peak / gib:.2f} GiB = {peak / input_bytes:.2f}x the inputs "
        f"(what must be allocated: the new [N, P] + [K, Q] parameters and the new Ũ [P] and A [K, Q] "
        f"kept as server state, {kept / gib:.2f} GiB = {kept / input_bytes:.2f}x; the copy adds "
        f"{copy_peak / gib:.2f} GiB); measured as {method}.",
    ]
    print("\n".join(lines))
    results_file.record("aggregation", "FedHCA² aggregation against a copy", "\n".join(lines))


if __name__ == "__main__":
    main()
