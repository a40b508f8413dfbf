"""Trace loaders (Mooncake JSONL, Azure CSV) and trajectory JSONL save/load.

Every reader raises ``ConfigError`` whose key is ``<file>:<line>`` for a malformed line. Named traces
resolve under ``<repo>/../shared/data/traces`` (or ``$DUALPATH_DATA_DIR/traces``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.core.paths import DATA_DIR_ENV, data_dir
from dualpath.workload.types import Trajectory, Turn

MOONCAKE_BLOCK_LEN = 512  # tokens per hash block in the Mooncake traces
MIN_SESSION_BLOCKS = 2  # a shared single block is usually a common system prompt, not a session

TRACE_FILES: dict[str, str] = {
    "mooncake-conversation": "traces/mooncake/conversation_trace.jsonl",
    "mooncake-synthetic": "traces/mooncake/synthetic_trace.jsonl",
    "azure-code": "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "azure-conv": "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
}
TRACE_ALIASES: dict[str, str] = {"mooncake": "mooncake-conversation"}  # short name -> TRACE_FILES key


def resolve_trace(name_or_path: str | Path) -> Path:
    """A trace name from ``TRACE_FILES`` (or an alias of one) or a path to an existing file.
    A named trace whose file is absent is a ConfigError saying where the reference data comes from."""
    text = TRACE_ALIASES.get(str(name_or_path), str(name_or_path))
    if text in TRACE_FILES:
        path = data_dir() / TRACE_FILES[text]
        if not path.is_file():
            raise ConfigError(
                "trace",
                text,
                f"{path} not found: named traces are read from the "
                f"reference data; set {DATA_DIR_ENV} to its folder (README, "
                "'Reference data'), or pass a trace file's path",
            )
        return path
    path = Path(text)
    if path.suffix in (".jsonl", ".csv", ".json") or path.exists():
        return path
    raise UnknownNameError("trace", text, [*TRACE_FILES, *TRACE_ALIASES])


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    yield lineno, line
    except OSError as exc:
        raise ConfigError("trace", str(path), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError("trace", str(path), "not UTF-8 text") from None


def _bad(path: Path, lineno: int, line: str, reason: str) -> ConfigError:
    return ConfigError(f"{path}:{lineno}", line.strip()[:80], reason)


def _int_field(obj: dict, key: str, minimum: int) -> int:
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{key} must be an int >= {minimum}, got {value!r}")
    return value


def _read_mooncake(path: Path, limit: int | None) -> list[tuple[float, int, int, list[int]]]:
    """The first ``limit`` records (all when None); lines after them are not read."""
    rows: list[tuple[float, int, int, list[int]]] = []
    for lineno, line in _lines(path):
        if limit is not None and len(rows) >= limit:
            break
        try:
            obj = json.loads(line)
            hashes = obj["hash_ids"]
            if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
                raise ValueError("hash_ids must be a list of ints")
            input_len = _int_field(obj, "input_length", 1)
            need = -(-input_len // MOONCAKE_BLOCK_LEN)
            if len(hashes) != need:
                raise ValueError(
                    f"{len(hashes)} hash_ids for input_length {input_len} "
                    f"(expected {need} blocks of {MOONCAKE_BLOCK_LEN})"
                )
            rows.append(
                (
                    float(obj["timestamp"]) / 1000.0,
                    input_len,
                    max(1, _int_field(obj, "output_length", 0)),
                    hashes,
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise _bad(path, lineno, line, f"bad Mooncake record: {exc}") from None
    if not rows and limit != 0:
        raise ConfigError("trace", str(path), "no records")
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class MooncakeRecord:
    """One request of a Mooncake trace as recorded: ``arrival_s`` (the ``timestamp`` in ms / 1000),
    lengths in tokens, and the hash id of each ``MOONCAKE_BLOCK_LEN``-token prompt block."""

    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


def read_mooncake(path: str | Path, limit: int | None = None) -> list[MooncakeRecord]:
    """The first ``limit`` records (all when None) of a Mooncake JSONL trace, request by request
    (``load_mooncake`` rebuilds sessions instead); same validation and errors."""
    return [
        MooncakeRecord(arrival_s=t, input_len=i, output_len=o, hash_ids=tuple(h))
        for t, i, o, h in _read_mooncake(resolve_trace(path), limit)
    ]


def load_mooncake(path: str | Path, limit: int | None = None) -> list[Trajectory]:
    """Rebuild multi-turn sessions from a Mooncake trace's prefix-hash chains.

    Requests are taken in file (timestamp) order. Request ``r`` continues the session whose latest
    request ``p`` has all its full 512-token blocks (the last block is partial) as a prefix of
    ``r``'s ``hash_ids``, with at least ``MIN_SESSION_BLOCKS`` full blocks and the longest such
    match winning; each request can be continued once (a second continuation starts a new
    session). ``append_len = r.input - (p.input + p.output)``, clamped to at least 1 token when the
    recorded prompt left out part of the previous answer. ``limit`` reads only the first records."""
    path = resolve_trace(path)
    rows = _read_mooncake(path, limit)
    sessions: list[list[Turn]] = []
    starts: list[float] = []
    context: list[int] = []
    tails: dict[tuple[int, int], int] = {}  # (full blocks, last full block id) -> session index
    for arrival_s, input_len, output_len, hashes in rows:
        session = None
        for k in range(len(hashes) - 1, MIN_SESSION_BLOCKS - 1, -1):
            session = tails.pop((k, hashes[k - 1]), None)
            if session is not None:
                break
        if session is None:
            session = len(sessions)
            sessions.append([Turn(append_len=input_len, gen_len=output_len)])
            starts.append(arrival_s)
            context.append(input_len + output_len)
        else:
            append_len = max(1, input_len - context[session])
            sessions[session].append(Turn(append_len=append_len, gen_len=output_len))
            context[session] += append_len + output_len
        num_full = input_len // MOONCAKE_BLOCK_LEN
        if num_full >= MIN_SESSION_BLOCKS:
            tails[(num_full, hashes[num_full - 1])] = session
    return [Trajectory(f"{path.stem}-{i}", tuple(turns), starts[i]) for i, turns in enumerate(sessions)]


def _parse_time_s(text: str) -> float:
    stamp, _, frac = text.strip().partition(".")
    base = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def load_azure(path: str | Path, limit: int | None = None) -> list[Trajectory]:
    """Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``): each row is a
    single-turn trajectory; ``arrival_s`` is seconds since the first row; 0 generated -> 1."""
    path = resolve_trace(path)
    out: list[Trajectory] = []
    first_s: float | None = None
    try:
        fh = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise ConfigError("trace", str(path), f"cannot read: {exc.strerror or exc}") from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != [
            "TIMESTAMP",
            "ContextTokens",
            "GeneratedTokens",
        ]:
            raise ConfigError(f"{path}:1", header, "expected header TIMESTAMP,ContextTokens,GeneratedTokens")
        for row in reader:
            lineno = reader.line_num
            if limit is not None and len(out) >= limit:
                break
            if not row:
                continue
            try:
                when_s = _parse_time_s(row[0])
                context_len, gen_len = int(row[1]), int(row[2])
                if context_len < 1 or gen_len < 0 or len(row) != 3:
                    raise ValueError("need 3 fields, ContextTokens >= 1, GeneratedTokens >= 0")
            except (ValueError, IndexError) as exc:
                raise _bad(path, lineno, ",".join(row), f"bad Azure row: {exc}") from None
            first_s = when_s if first_s is None else first_s
            turn = Turn(append_len=context_len, gen_len=max(1, gen_len))
            out.append(Trajectory(f"{path.stem}-{len(out)}", (turn,), when_s - first_s))
    return out


def save_jsonl(trajs: Sequence[Trajectory], path: str | Path) -> None:
    """One JSON object per line: ``{"traj_id", "turns": [[append, gen], ...], "arrival_s",
    "parent_id"}``. ``load_jsonl`` reads it back exactly."""
    with open(path, "w", encoding="utf-8") as fh:
        for t in trajs:
            fh.write(
                json.dumps(
                    {
                        "traj_id": t.traj_id,
                        "turns": [[u.append_len, u.gen_len] for u in t.turns],
                        "arrival_s": t.arrival_s,
                        "parent_id": t.parent_id,
                    }
                )
                + "\n"
            )


def load_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories written by ``save_jsonl``."""
    path = Path(path)
    out = []
    for lineno, line in _lines(path):
        try:
            obj = json.loads(line)
            turns = tuple(Turn(append_len=a, gen_len=g) for a, g in obj["turns"])
            parent = obj.get("parent_id")
            out.append(Trajectory(obj["traj_id"], turns, float(obj.get("arrival_s", 0.0)), parent))
        except (ValueError, KeyError, TypeError) as exc:
            raise _bad(path, lineno, line, f"bad trajectory record: {exc}") from None
    return out


def load_trace(name_or_path: str | Path, limit: int | None = None) -> list[Trajectory]:
    """Load by name or path: Mooncake JSONL (records with ``hash_ids``), trajectory JSONL, or an
    Azure CSV."""
    path = resolve_trace(name_or_path)
    if path.suffix == ".csv":
        return load_azure(path, limit)
    for _, line in _lines(path):
        if '"hash_ids"' in line:
            return load_mooncake(path, limit)
        break
    trajs = load_jsonl(path)
    return trajs if limit is None else trajs[:limit]
