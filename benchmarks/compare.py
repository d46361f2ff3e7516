"""Compare the suite rows of two BENCHMARKS.md files: each row's ratio before and after, flagged when worse
by more than its spread (the relative min-max of either side's rounds in either run).

Usage: ``python benchmarks/compare.py OLD.md NEW.md`` (rows are matched by section, case, pass, sizes and
comparison; a single-round row has no spread, so any increase flags it: measure it again).
"""

from __future__ import annotations

import re
import sys

_TIMES = re.compile(r"([\d.]+) \(([\d.]+)-([\d.]+)\)")


def rows(path: str) -> dict:
    out, section = {}, None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.startswith("### "):
            section = line[4:].split(" (")[0].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] in ("case", "") or section is None or len(cells) < 10:
            continue
        try:
            ratio = float(cells[7])
        except ValueError:
            continue
        times = [tuple(map(float, m.groups())) for m in map(_TIMES.match, cells[5:7]) if m]
        out[(section, cells[0], cells[1], cells[2], cells[4])] = (ratio, times)
    return out


def main(argv=None) -> int:
    old_path, new_path = (argv or sys.argv[1:])[:2]
    old, new = rows(old_path), rows(new_path)
    worse = 0
    for key, (before, times) in old.items():
        if key not in new:
            print("missing after:", " | ".join(key))
            continue
        after, times_after = new[key]
        spread = max([(hi - lo) / mid for mid, lo, hi in times + times_after if mid > 0] or [0.0])
        flag = after > before * (1 + spread)
        worse += flag
        print(f"{'WORSE' if flag else '     '} {before:7.3f} -> {after:7.3f} (spread {spread:4.2f})  {' | '.join(key)}")
    print(f"{len(old)} rows, {worse} worse by more than their spread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
