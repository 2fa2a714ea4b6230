"""Temporary probe: several shapes timed interleaved (graphs), to compare rows of equal work."""
import statistics, sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import torch, mla
from perf_table import bench, grid

def fn(cfg, causal, seed=0, pipeline="2wg"):
    inp = bench.make_inputs(cfg, device="cuda", seed=seed)
    dec = mla.MLADecoder(pipeline=pipeline)
    dec.plan(inp.cache_seqlens, num_heads_q=cfg.h_q, seq_len_q=cfg.s_q, num_heads_k=1, page_size=64,
             dtype=inp.q.dtype, causal=causal)
    out = torch.empty(cfg.b, cfg.s_q, cfg.h_q, 512, dtype=inp.q.dtype, device="cuda")
    f = lambda: dec.run(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, out=out)
    return f, dec

for b in [int(x) for x in sys.argv[1].split(",")]:
    L = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    shapes = {"s1h16": (1, 16, False, 0), "s1h32": (1, 32, False, 0), "s2h16c": (2, 16, True, 0),
              "s2h16nc": (2, 16, False, 0), "s2h16c-seed1": (2, 16, True, 1), "s1h32-seed1": (1, 32, False, 1),
              "s2h32c": (2, 32, True, 0), "s1h64": (1, 64, False, 0)}
    graphs = {}
    for name, (s, h, causal, seed) in shapes.items():
        f, dec = fn(grid.Config(64, b, s, h, L), causal, seed)
        graphs[name] = bench.capture_graph(f)
    for p in range(2):
        samples = bench.time_graphs_interleaved(graphs, replays=300)
        print(f"b{b} L{L} pass {p+1}: " + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in samples.items()), flush=True)
