"""The summary of benchmarks/results/cost_model.jsonl that docs/cost_model.md quotes: per setting
(label, collective, ranks, hosts), how many held-out cases of 64 KiB to 256 MiB the model predicts within 25 %
of the measured median (and, where recorded, the same rounds' predictions without one term), the
median and worst error, per family; below 64 KiB the spread between rounds instead. Then the
choice the predictions make: at how many sizes the family predicted fastest measured fastest, and
how much longer the chosen family took than the fastest (the worst size, and the geometric mean).
Last, where the rows hold several runs of one layout, how far the same case's measured time against
its prediction moved between runs (each run's prediction from its own probe): a case whose ratio
moves by more than 1.25 / 0.75 = 1.67x cannot be within 25 % in both runs under any one
correction of the model.

    python benchmarks/cost_model_summary.py [--commit SHORT_SHA ...] [--label START]
"""

import argparse
import collections
import json
import pathlib
import statistics

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "cost_model.jsonl"
SMALL = 64 << 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", nargs="+", help="only the rows measured at these commits")
    parser.add_argument("--label", default="", help="only the rows whose label starts so")
    args = parser.parse_args()
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    rows = [row for row in rows
            if (not args.commit or row["commit"] in args.commit) and row["label"].startswith(args.label)]
    settings = collections.defaultdict(list)
    for row in rows:
        settings[_setting(row), row["ranks"], row["hosts"]].append(row)
    _accuracy(settings)
    print()
    _choice(settings)
    print()
    _between_runs(rows)


def _accuracy(settings):
    print("| setting | ranks | family | within 25 % (64 KiB+) | without the fresh-data term "
          "| without the handover term | median error | worst | below 64 KiB: round spread |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (label, ranks, hosts), cases in settings.items():
        for family in dict.fromkeys(row["family"] for row in cases):
            mine = [row for row in cases if row["family"] == family]
            large = [row for row in mine if row["bytes"] >= SMALL]
            errors = [row["predicted"] / row["median"] - 1 for row in large]
            small = [row["max"] / row["min"] for row in mine if row["bytes"] < SMALL]
            without = [f"{_within(large, key)} of {len(large)}" if all(key in row for row in large) else "-"
                       for key in ("without_fresh", "without_handover")]
            print(f"| {label} | {ranks} on {hosts} | {family} | {_within(large, 'predicted')} of {len(large)} | "
                  f"{' | '.join(without)} | {statistics.median(abs(e) for e in errors):.0%} | "
                  f"{max(errors, key=abs):+.0%} | " + (f"{max(small):.1f}x |" if small else "- |"))


def _choice(settings):
    print("| setting | ranks | sizes where the predicted fastest measured fastest | chosen against fastest: worst "
          "| geometric mean |")
    print("|---|---|---|---|---|")
    for (label, ranks, hosts), cases in settings.items():
        sizes = collections.defaultdict(list)
        for row in cases:
            sizes[row["bytes"]].append(row)
        slower = [min(rows, key=lambda r: r["predicted"])["median"] / min(r["median"] for r in rows)
                  for rows in sizes.values()]
        print(f"| {label} | {ranks} on {hosts} | {sum(s == 1.0 for s in slower)} of {len(slower)} | "
              f"{max(slower):.2f}x | {statistics.geometric_mean(slower):.2f}x |")


def _between_runs(rows):
    """Per layout (ranks, hosts) and size band, how far each case's measured/predicted moved across runs."""
    print("| ranks | sizes | runs | cases | largest ratio against smallest: median | worst | cases over 1.67x |")
    print("|---|---|---|---|---|---|---|")
    groups = collections.defaultdict(lambda: collections.defaultdict(list))  # (ranks, hosts, band) -> case -> ratios
    for row in rows:
        if row["bytes"] >= SMALL:
            band = "64 KiB-1 MiB" if row["bytes"] <= 1 << 20 else "2 MiB and up"
            ratio = row["median"] / row["predicted"]
            groups[row["ranks"], row["hosts"], band][_collective(row), row["family"], row["bytes"]].append(ratio)
    for (ranks, hosts, band), cases in groups.items():
        spreads = [max(ratios) / min(ratios) for ratios in cases.values() if len(ratios) > 1]
        if spreads:
            runs = max(len(ratios) for ratios in cases.values())
            print(f"| {ranks} on {hosts} | {band} | {runs} | {len(spreads)} | {statistics.median(spreads):.2f}x | "
                  f"{max(spreads):.2f}x | {sum(s > 1.25 / 0.75 for s in spreads)} |")


def _collective(row):
    return row.get("collective", "allreduce")  # rows from before other collectives were measured


def _setting(row):
    """The label, and the collective where it is not the allreduce."""
    collective = _collective(row)
    return row["label"] if collective == "allreduce" else f"{row['label']}, {collective}"


def _within(rows, key):
    """How many of `rows` have `key`'s prediction within 25 % of the measured median."""
    return sum(abs(row[key] / row["median"] - 1) <= 0.25 for row in rows)


if __name__ == "__main__":
    main()
