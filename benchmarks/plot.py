"""Draw benchmark results as PNG images.

    .venv/bin/python benchmarks/plot.py [RESULTS.json ...] [--out-dir docs/img]

Reads the document ``benchmarks/run.py`` writes (default ``benchmarks/results/bench.json``)
or the files of single benchmarks (``wide.json`` of ``wide_groups.py``, ``sql.json`` of
``sql_groups.py``) and writes, for what it finds:

- ``bench-wide.png``: µs per child against group width, one line per tier (log axes; the
  bars span the rounds' range; a width a tier refused or did not finish is marked); with
  the engines' runs against their native fan-outs (``restate-wide-native``,
  ``temporal-wide-native`` of run.py, or their files), a second panel draws each engine's
  ``all_`` beside its native fan-out;
- ``bench-sql.png``: settled children/s against concurrent callers per SQL backend,
  effecthost beside its honest ceiling (bars: range over the rounds), the ratio at each
  point.

Needs matplotlib (``pip install -e '.[bench]'``); renders with the Agg backend, no display.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TIER_ORDER = ("memory", "sqlite", "postgres", "restate", "temporal")


def load(paths: list[Path]) -> dict[str, Any]:
    """The results by kind (``wide``, ``sql``), from run.py's document or single files."""
    found: dict[str, Any] = {}
    for path in paths:
        document = json.loads(path.read_text())
        if "benchmarks" in document:
            for name, entry in document["benchmarks"].items():
                if "result" in entry:
                    # ``wide-local`` is ``wide`` over the local tiers only
                    found["wide" if name == "wide-local" else name] = entry["result"]
        elif document.get("rows") and "tier" in document["rows"][0]:
            found["wide"] = document
        elif document.get("widths") and "handler" in document["widths"][0]:
            found["restate-wide-native"] = document
        elif document.get("native_shard") and document.get("rows"):
            found["temporal-wide-native"] = document
        elif document.get("rows") and "ceiling" in document["rows"][0]:
            found["sql"] = document
    return found


def native_series(found: dict[str, Any]) -> dict[str, dict[int, list[float]]]:
    """µs per child by line (``Restate all_``, ``Restate native``, ...) and width, every
    round, from the engines' runs against their native fan-outs."""
    series: dict[str, dict[int, list[float]]] = {}
    for row in (found.get("restate-wide-native") or {}).get("widths", []):
        side = "all_" if row["handler"] == "effecthost" else "native fan-out"
        line = series.setdefault(f"Restate {side}", {})
        line.setdefault(row["children"], []).append(row["us_per_child"])
    for row in (found.get("temporal-wide-native") or {}).get("rows", []):
        if "us_per_child" not in row:
            continue  # a ratio row
        name = row["controller"]
        side = "native fan-out" if name == "native" else f"all_ ({name} shards)"
        if name == "default":
            side = "all_"
        line = series.setdefault(f"Temporal {side}", {})
        line.setdefault(row["children"], []).extend(row["us_per_child"])
    return series


def _draw_native(ax: Any, series: dict[str, dict[int, list[float]]]) -> None:
    import statistics

    for name, points in sorted(series.items()):
        xs = sorted(points)
        ys = [statistics.median(points[x]) for x in xs]
        low = [y - min(points[x]) for x, y in zip(xs, ys, strict=True)]
        high = [max(points[x]) - y for x, y in zip(xs, ys, strict=True)]
        native = "native" in name
        # each engine in its colour of the tiers' panel; native dashed, our shards dotted
        tier = "restate" if name.startswith("Restate") else "temporal"
        ax.errorbar(
            xs,
            ys,
            yerr=[low, high],
            marker="s" if native else "o",
            linestyle="--" if native else (":" if "shards" in name else "-"),
            color=f"C{TIER_ORDER.index(tier)}",
            capsize=3,
            label=name,
        )
    widths = sorted({x for points in series.values() for x in points})
    _per_child_axes(ax, widths, "Engines: all_ beside the native fan-out (same run)")
    ax.legend(fontsize=7)


def _per_child_axes(ax: Any, widths: list[int], title: str) -> None:
    """Log-log axes of µs per child against group width, a tick per width measured."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(widths, [f"{w:,}" for w in widths])
    ax.minorticks_off()
    ax.set_xlabel("children in the group")
    ax.set_ylabel("µs per child (wall time ÷ children)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)


def plot_wide(
    document: dict[str, Any] | None,
    out: Path,
    series: dict[str, dict[int, list[float]]] | None = None,
) -> None:
    import matplotlib.pyplot as plt

    if document is None:
        fig, native_ax = plt.subplots(figsize=(7.5, 4.8))
        _draw_native(native_ax, series or {})
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return
    if series:
        fig, (ax, native_ax) = plt.subplots(1, 2, figsize=(14, 4.8))
        _draw_native(native_ax, series)
    else:
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
    rows = [r for r in document["rows"] if r.get("width")]
    tiers = sorted({r["tier"] for r in rows}, key=lambda t: TIER_ORDER.index(t))
    refused = []
    for tier in tiers:
        done = [r for r in rows if r["tier"] == tier and "us_per_child" in r]
        done.sort(key=lambda r: r["width"])
        if done:
            xs = [r["width"] for r in done]
            ys = [r["us_per_child"] for r in done]
            low = [r["us_per_child"] - r["us_min"] for r in done]
            high = [r["us_max"] - r["us_per_child"] for r in done]
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=tier)
        refused += [r for r in rows if r["tier"] == tier and "us_per_child" not in r]
    widths = sorted({r["width"] for r in rows})
    _per_child_axes(ax, widths, "One all_ group, one caller: cost per child against group width")
    if refused:
        note = "not completed: " + "; ".join(
            f"{r['tier']} {r['width']:,} ({r['status']})" for r in refused
        )
        fig.text(0.01, 0.01, note, fontsize=7, wrap=True)
    ax.legend()
    fig.tight_layout(rect=(0, 0.05 if refused else 0, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_sql(document: dict[str, Any], out: Path) -> None:
    import matplotlib.pyplot as plt

    rows = [r for r in document["rows"] if r["workload"] == "2-child groups"]
    panels: list[tuple[str, Any]] = []
    for r in rows:
        if (r["substrate"], r["fsync"]) not in panels:
            panels.append((r["substrate"], r["fsync"]))
    panels.sort(key=lambda k: (k[0] != "postgres", k[1] != "on"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (substrate, fsync) in zip(axes[0], panels, strict=True):
        mine = sorted(
            (r for r in rows if (r["substrate"], r["fsync"]) == (substrate, fsync)),
            key=lambda r: r["callers"],
        )
        xs = [r["callers"] for r in mine]
        for side, label in (("ceiling", "honest ceiling"), ("effecthost", "effecthost")):
            ys = [r[side]["children_per_s"] for r in mine]
            low = [r[side]["children_per_s"] - r[side]["min"] for r in mine]
            high = [r[side]["max"] - r[side]["children_per_s"] for r in mine]
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)
        for r in mine:
            ax.annotate(
                f"{r['ratio']:.2f}",
                (r["callers"], r["effecthost"]["children_per_s"]),
                textcoords="offset points",
                xytext=(4, -12),
                fontsize=8,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrent callers")
        ax.set_title(substrate if fsync is None else f"{substrate}, fsync={fsync}")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("settled children/s (2-child groups)")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.suptitle("SQL tiers against their honest ceilings (numbers: effecthost ÷ ceiling)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--out-dir", type=Path, default=HERE.parent / "docs" / "img")
    options = parser.parse_args()
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot.py needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    found = load(options.results or [HERE / "results" / "bench.json"])
    options.out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    series = native_series(found)
    if "wide" in found or series:
        plot_wide(found.get("wide"), options.out_dir / "bench-wide.png", series)
        drawn.append("bench-wide.png")
    if "sql" in found:
        plot_sql(found["sql"], options.out_dir / "bench-sql.png")
        drawn.append("bench-sql.png")
    if not drawn:
        raise SystemExit("no wide-group or SQL results in the given files")
    print(f"wrote {', '.join(str(options.out_dir / d) for d in drawn)}")


if __name__ == "__main__":
    main()
