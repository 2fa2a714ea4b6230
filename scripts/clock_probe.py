"""How a compute-bound row's graph replays spread, beside the SM clock and power while they run.

    python scripts/clock_probe.py [--config 64,128,1,128,1024] [--replays 2000] [--batch 20]

Plans one ``mla.MLADecoder`` (auto) for the config, captures one ``run`` call in a CUDA graph and
replays it ``--replays`` times in batches of ``--batch`` behind the perf runner's backlog kernel, CUDA
events around each replay (``perf_table.bench``'s method); ``nvidia-smi`` samples the SM clock and the
power draw every 20 ms meanwhile. Prints the replay-time percentiles, the times of successive
batches, and the clock and power samples, so a bimodal row (the perf runner's b128 s1 h128 1024:
medians 79-91 us, minima 71-80 us on one H200) can be told apart from a clock or power effect, and the
median replay time by position in its batch (whether the first replay behind the backlog differs).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smi_sampler import smi_samples  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="64,128,1,128,1024", help="page,b,s_q,h_q,seqlen")
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=20)
    args = ap.parse_args(argv)

    import torch

    import mla
    from perf_table import bench, grid

    cfg = grid.Config(*(int(x) for x in args.config.split(",")))
    inp = bench.make_inputs(cfg, device="cuda", seed=0)
    call = bench.make_decode_fn(mla, "auto", cfg, inp)  # the perf runner's callable
    graph = bench.capture_graph(call)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    with smi_samples("timestamp,clocks.sm,power.draw,temperature.gpu", 20) as samples:
        time.sleep(0.3)
        times, batch_medians = [], []
        for first in range(0, args.replays, args.batch):
            batch = bench.replay_times(graph, min(args.batch, args.replays - first))
            times += batch
            batch_medians.append(statistics.median(batch))
        time.sleep(0.3)
    q = statistics.quantiles(times, n=20)
    print(f"{cfg.label()}: {len(times)} replays, us: min {min(times):.1f} p5 {q[0]:.1f} p25 {q[4]:.1f} "
          f"median {statistics.median(times):.1f} p75 {q[14]:.1f} p95 {q[18]:.1f} max {max(times):.1f}")
    print("batch medians:", " ".join(f"{m:.1f}" for m in batch_medians))
    # Median by position in a batch (0: the first replay behind the backlog kernel).
    by_pos = [statistics.median(times[i::args.batch]) for i in range(min(args.batch, len(times)))]
    print("median by position in the batch:", " ".join(f"{m:.1f}" for m in by_pos))
    print(f"nvidia-smi samples ({len(samples)}): timestamp, SM clock, power, temperature")
    for line in samples[:: max(1, len(samples) // 40)]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
