"""AIConfigurator's own predictions for a JSONL of deployments (one ``cli_estimate`` call each).

Runs in a Python that has ``aiconfigurator`` (``pip install aiconfigurator==0.12.0``; it needs
nothing of dualpath's): ``python benchmarks/aic_estimate.py in.jsonl out.jsonl``. Each input line is
``{"key": ..., "kwargs": {cli_estimate's keyword arguments}}``; each output line is ``{"key": ...,
"ttft_ms": ..., "tpot_ms": ...}`` or ``{"key": ..., "error": "..."}``. benchmarks/
plan_latency_accuracy.py writes the input from the CSV rows it predicts (with the same derived
fields) and reads the output. Uses its SILICON database at its newest version for the system and
backend (the rows' own backend versions are mostly not in it).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import time


def main(src: str, dst: str) -> int:
    from aiconfigurator.cli.api import cli_estimate

    logging.disable(logging.WARNING)
    with open(src, encoding="utf-8") as fh:
        jobs = [json.loads(line) for line in fh if line.strip()]
    start = time.perf_counter()
    with open(dst, "w", encoding="utf-8") as out:
        for i, job in enumerate(jobs):
            record: dict[str, object] = {"key": job["key"]}
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    result = cli_estimate(**job["kwargs"])
                record.update(ttft_ms=float(result.ttft), tpot_ms=float(result.tpot))
            except Exception as exc:  # noqa: BLE001 - a row AIConfigurator refuses is recorded, not fatal
                record["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            out.write(json.dumps(record) + "\n")
            out.flush()
            if (i + 1) % 25 == 0:
                print(f"aic: {i + 1}/{len(jobs)} rows, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
