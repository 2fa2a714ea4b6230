"""One PNG per device: speed-up over FlashMLA (or time, where the device has no FlashMLA anchor)
against seqlen, one panel per (s_q, h_q), one line per (pipeline, batch).

Importing this module needs matplotlib; ``regenerate`` skips the plots when it is missing. The PNG
bytes are deterministic for a given matplotlib and FreeType: the Agg backend, fixed size and dpi,
and no "Software" text chunk (it would carry the matplotlib version).
"""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from .anchors import PRIMARY as REFERENCE, anchor_key  # noqa: E402
from .grid import BATCHES, H_QS, S_QS, SEQLENS  # noqa: E402

_LINESTYLES = ("-", "--", ":", "-.")


def plot_device(path: pathlib.Path, device: str, rows: list[dict], anchors: dict) -> None:
    """Draw ``rows`` (page 64, uniform lengths, measured) of ``device`` into ``path``."""
    reference = anchors.get(REFERENCE, {})

    def ref_us(row):
        key = anchor_key(device, row["dtype"], row["page_size"], row["b"], row["s_q"], row["h_q"], row["seqlen"],
                         row["varlen"])
        return reference[key].us if key in reference else None

    speedup = any(ref_us(row) is not None for row in rows)
    pipelines = sorted({row["pipeline"] for row in rows})
    colors = plt.get_cmap("viridis")
    fig, axes = plt.subplots(len(S_QS), len(H_QS), figsize=(16, 7), sharex=True, squeeze=False)
    for i, s_q in enumerate(S_QS):
        for j, h_q in enumerate(H_QS):
            ax = axes[i][j]
            for p, pipeline in enumerate(pipelines):
                for k, b in enumerate(BATCHES):
                    points = []
                    for row in sorted(rows, key=lambda r: r["seqlen"]):
                        if (row["pipeline"], row["b"], row["s_q"], row["h_q"]) != (pipeline, b, s_q, h_q):
                            continue
                        y = (ref_us(row) / row["us"] if ref_us(row) is not None else None) if speedup else row["us"]
                        if y is not None:
                            points.append((row["seqlen"], y))
                    if points:
                        xs, ys = zip(*points)
                        ax.plot(xs, ys, _LINESTYLES[p % len(_LINESTYLES)], marker="o", markersize=3,
                                color=colors(k / max(len(BATCHES) - 1, 1)),
                                label=f"{pipeline} b{b}")
            if speedup:
                ax.axhline(1.0, color="grey", linewidth=0.8)
            else:
                ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            ax.set_xticks(SEQLENS, [str(s) for s in SEQLENS])
            ax.minorticks_off()
            ax.set_title(f"s_q {s_q}, h_q {h_q}", fontsize=10)
            ax.grid(True, linewidth=0.3)
            if j == 0:
                ax.set_ylabel(f"x{REFERENCE} ({REFERENCE} us / ours)" if speedup else "time (us)")
            if i == len(S_QS) - 1:
                ax.set_xlabel("seqlen")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat[1:]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="center right", fontsize=8)
    what = f"speed-up over {REFERENCE}" if speedup else "time"
    fig.suptitle(f"{device}: {what} vs seqlen, page size 64 (newest run per config)")
    fig.tight_layout(rect=(0, 0, 0.92, 0.96))
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)
