"""CSV mode speed of `dualpath plan latency` (the simulation): N rows on one core, and one deployment.

Takes one system's rows of a CSV in AIConfigurator's silicon layout (default h100_sxm, the only
system this project reads) and cycles them to ``--rows`` rows, the k-th pass adding k tokens to
every prompt so that no row repeats (the rows in a seeded shuffle, so a short run is a sample) (the per-(deployment, isl, osl) step memo cannot carry a
repeated row; the kernel-table memo is shared, as in a real CSV run). Prints the process CPU
time (one core: the simulation is single-threaded), the wall time and the load average, and the
CPU time of one deployment answered from a fresh process (imports and table loading included).

    python benchmarks/plan_latency_speed.py silicon_sample.csv --rows 2000
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from dualpath.core.errors import DualpathError
from dualpath.latency.predict import simulate
from dualpath.latency.rows import deployment_from_row

HERE = Path(__file__).resolve().parent
ONE = (
    "import time; t = time.process_time(); "
    "from dualpath.cost.deployment import Deployment, Layout; from dualpath.latency.predict import simulate; "
    "simulate(Deployment(model='Qwen/Qwen3-32B', system='h100_sxm', backend='vllm', precision='fp8', "
    "isl=4000, osl=500, batch_size=32, layout=Layout(tp=2))); print(time.process_time() - t)"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--system", default="h100_sxm")
    ap.add_argument("--rows", type=int, default=2000)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from plan_latency_accuracy import read_rows

    base = read_rows(args.csv, args.system)
    random.Random(0).shuffle(base)  # a short run samples every kind of row
    if not base:
        print(f"no {args.system} rows in {args.csv}", file=sys.stderr)
        return 1
    one = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True, check=True)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    done = errors = 0
    while done < args.rows:
        row = dict(base[done % len(base)])
        row["isl"] = str(int(float(row["isl"])) + done // len(base))
        try:
            simulate(deployment_from_row(row))
        except DualpathError:
            errors += 1
        done += 1
        if done % 200 == 0:
            print(f"{done} rows, {time.process_time() - cpu0:.0f} s CPU", file=sys.stderr)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(
        f"{done} rows ({errors} refused) in {cpu:.0f} s CPU on one core ({wall:.0f} s wall, "
        f"load average {os.getloadavg()[0]:.1f}); {done / cpu:.1f} rows per CPU second; "
        f"one deployment from a fresh process: {float(one.stdout):.2f} s CPU"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
