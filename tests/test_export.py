"""Evidence export (`kf export`) and its offline audit (`kf audit --file`), on a real Postgres log.

The offline audit recomputes every hash in Python (engine/evidence/event_hash.py); the first tests pin that
twin to the database's own kf_event_hash, on the texts most likely to differ (escapes, control characters,
non-ASCII, numbers jsonb rewrites, instants before 1970). The rest export real events through the real CLI and
the Python API and change the files: any changed byte fails the audit (exit 1) and is named, and only a file
that is not an export at all is bad input (exit 2).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pty
import random
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cli
from engine.evidence.event_hash import epoch_text, event_hash, json_text
from engine.evidence.events import NewEvent
from engine.evidence.export import JsonlSink, export_evidence
from engine.evidence.export_format import ExportDigest
from engine.evidence.export_parquet import ParquetSink
from engine.evidence.offline_audit import audit_export
from engine.evidence.store import EventStore
from engine.search.history import stream_of

SEARCH = "export-one"
OTHER = "export-two"
ODD_STREAM = 'odd "stream" \\ \x01\x1f\t\x7f é 😀 \u2028'
TRICKY_TEXT = 'quote " backslash \\ newline \n tab \t bell \x07 unit \x1f del \x7f é 😀 \u2028 / </script>'
KF = str(Path(sys.executable).with_name("kf"))


def payload(n: int) -> dict[str, Any]:
    """A payload whose jsonb text differs from Python's JSON: key order, spacing, and numbers jsonb rewrites."""
    return {
        "n": n,
        "ratio": 1.0,
        "tiny": 1e-07,
        "big": 1.5e20,
        "negative_zero": -0.0,
        "huge_int": 2**70,
        "text": TRICKY_TEXT,
        "nested": {"b": [1, 2.5, None, True, False, ""], "a": {}, "bb": []},
        "zz": "last in Python, first by length in jsonb",
    }


async def fill(store: EventStore) -> None:
    """Three streams appended in interleaved batches, so a search's positions are not contiguous."""
    for batch in range(4):
        for stream in (stream_of(SEARCH), stream_of(OTHER), ODD_STREAM):
            events = [
                NewEvent(
                    event_id=f"{stream}/{batch}/{i}",
                    type="test.step" if stream != ODD_STREAM else 'type "odd" \\ \x02',
                    payload=payload(batch * 10 + i),
                    metadata={"worker": "w1", "attempt": batch + 1, "note": TRICKY_TEXT},
                    schema_version=1 + batch % 2,
                )
                for i in range(2)
            ]
            await store.append(stream, events)


@pytest.fixture
async def log(store: EventStore) -> EventStore:
    await fill(store)
    return store


async def export_bytes(store: EventStore, search_id: str | None, when: datetime | None = None) -> bytes:
    out = io.BytesIO()
    await export_evidence(store, JsonlSink(out), search_id=search_id, exported_at=when)
    return out.getvalue()


def kf_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


async def audit_cli(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict[str, Any]]:
    status = await asyncio.to_thread(cli.main, ["audit", "--file", str(path), "--json"])
    return status, json.loads(capsys.readouterr().out)


def checks(report: dict[str, Any]) -> set[str]:
    return {finding["check"] for finding in report["findings"]}


# -- the hash's Python twin against the database ------------------------------------------------------------


async def test_python_hash_matches_the_database_for_every_stored_event(log: EventStore) -> None:
    rows = await log.pool.fetch(
        "SELECT position, event_id, stream_id, stream_version, type, schema_version, payload::text AS payload, "
        "metadata::text AS metadata, recorded_at, prev_hash, hash FROM events ORDER BY position"
    )
    assert len(rows) == 24
    for row in rows:
        recomputed = event_hash(
            prev_hash=row["prev_hash"],
            position=row["position"],
            event_id=row["event_id"],
            stream_id=row["stream_id"],
            stream_version=row["stream_version"],
            type=row["type"],
            schema_version=row["schema_version"],
            recorded_at=row["recorded_at"],
            payload_text=row["payload"],
            metadata_text=row["metadata"],
        )
        assert recomputed == row["hash"], row["event_id"]


async def test_string_and_epoch_texts_match_postgres(store: EventStore) -> None:
    texts = ["".join(chr(c) for c in range(1, 128)), TRICKY_TEXT, ODD_STREAM, "", "\u00e9\u0301\U0001f600\ufeff"]
    for text in texts:
        assert json_text(text) == await store.pool.fetchval("SELECT to_jsonb($1::text)::text", text)
    base = datetime(1970, 1, 1, tzinfo=UTC)
    instants = [
        base,
        base - timedelta(microseconds=1),
        base - timedelta(seconds=1, microseconds=250_000),
        datetime(1900, 2, 28, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2024, 1, 1, 12, 0, 0, 5, tzinfo=UTC),
        datetime(2024, 6, 1, 12, 0, tzinfo=UTC).astimezone(),  # the same instant in another zone
    ]
    for instant in instants:
        expected = await store.pool.fetchval(
            "SELECT jsonb_build_array(extract(epoch FROM $1::timestamptz))::text", instant
        )
        assert f"[{epoch_text(instant)}]" == expected, instant


# -- export and audit, intact ---------------------------------------------------------------------------------


async def test_cli_exports_a_search_as_jsonl_to_stdout_and_the_offline_audit_passes(
    log: EventStore, fresh_db_url: str, tmp_path: Path
) -> None:
    env = os.environ | {"KF_DATABASE_URL": fresh_db_url}
    done = await asyncio.to_thread(subprocess.run, [KF, "export", SEARCH], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.splitlines()
    header, end = json.loads(lines[0]), json.loads(lines[-1])
    assert header["kind"] == "kf-evidence-export" and header["search_id"] == SEARCH
    assert header["events"] == 8 == end["events"] == len(lines) - 2
    assert [head["stream_id"] for head in header["streams"]] == [stream_of(SEARCH)]
    events = [json.loads(line) for line in lines[1:-1]]
    assert {event["stream_id"] for event in events} == {stream_of(SEARCH)}
    assert [event["stream_version"] for event in events] == list(range(1, 9))
    assert json.loads(events[0]["payload"]) == json.loads(json.dumps(payload(0)))  # the jsonb text reads back
    path = tmp_path / "search.jsonl"
    path.write_bytes(done.stdout)

    audited = await asyncio.to_thread(
        subprocess.run, [KF, "audit", "--file", str(path)], capture_output=True, timeout=60
    )
    assert audited.returncode == 0, audited.stdout.decode()
    text = audited.stdout.decode()
    assert "INTACT" in text and f"kf audit {SEARCH}" in text
    stored_head = (await log.read_stream(stream_of(SEARCH)))[-1]
    assert stored_head.hash in text  # the head to compare with the witness


async def test_whole_log_export_audits_positions_from_one(
    log: EventStore,
    fresh_db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KF_DATABASE_URL", fresh_db_url)
    path = tmp_path / "log.jsonl"
    status, _, err = await asyncio.to_thread(kf_main, capsys, "export", "--all", "--output", str(path))
    assert status == 0 and f"kf audit --file {path}" in err
    status, report = await audit_cli(capsys, path)
    assert status == 0 and report["intact"]
    assert report["events"] == report["hashes_checked"] == 24
    assert report["header"]["search_id"] is None and report["header"]["log_committed"] == 24
    assert {head["stream_id"] for head in report["streams"]} == {stream_of(SEARCH), stream_of(OTHER), ODD_STREAM}

    lines = path.read_bytes().splitlines(keepends=True)
    odd = next(n for n, line in enumerate(lines) if b'"stream_id":"odd' in line)
    assert b"\\u0001" in lines[odd]  # the control character in the odd stream's id, as JSON escapes it
    surrogate = tmp_path / "surrogate.jsonl"  # \u0001 becomes \ud801, a lone surrogate no Postgres text holds
    surrogate.write_bytes(b"".join([*lines[:odd], lines[odd].replace(b"\\u0001", b"\\ud801", 1), *lines[odd + 1 :]]))
    status, report = await audit_cli(capsys, surrogate)
    assert status == 1 and report["findings"][0]["check"] == "malformed" and report["findings"][0]["line"] == odd + 1

    # The first event removed: a whole-log export must start at position 1.
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(lines[0] + b"".join(lines[2:]))
    status, report = await audit_cli(capsys, cut)
    assert status == 1 and "position_gap" in checks(report)


async def test_parquet_round_trip_holds_the_same_records_and_digest(log: EventStore, tmp_path: Path) -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    jsonl = await export_bytes(log, None, when)
    path = tmp_path / "log.parquet"
    with path.open("wb") as file:
        end = await export_evidence(log, ParquetSink(file), exported_at=when)
    assert path.read_bytes()[:4] == b"PAR1"
    assert json.loads(jsonl.splitlines()[-1])["digest"] == end.digest  # the same lines sealed in both formats
    rows = pq.read_table(path).to_pylist()
    events = [json.loads(line) for line in jsonl.splitlines()[1:-1]]
    assert [row["hash"] for row in rows] == [event["hash"] for event in events]
    assert [row["payload"] for row in rows] == [event["payload"] for event in events]
    report = audit_export(path)
    assert report.intact and report.format == "parquet" and report.events == 24, report.findings


async def test_parquet_export_through_the_cli_and_a_changed_value_is_found(
    log: EventStore,
    fresh_db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KF_DATABASE_URL", fresh_db_url)
    path = tmp_path / "evidence.data"  # no telling extension: the audit reads the magic bytes
    status, _, _ = await asyncio.to_thread(kf_main, capsys, "export", SEARCH, "--format", "parquet", "-o", str(path))
    assert status == 0
    status, report = await audit_cli(capsys, path)
    assert status == 0 and report["format"] == "parquet" and report["events"] == 8

    # One value of one payload changed, the file otherwise rewritten as it was (metadata included).
    table = pq.read_table(path)
    metadata = pq.ParquetFile(path).metadata.metadata
    payloads = table.column("payload").to_pylist()
    payloads[3] = payloads[3].replace('"n": 11', '"n": 12')
    assert payloads[3] != table.column("payload")[3].as_py()
    changed = table.set_column(table.schema.get_field_index("payload"), "payload", pa.array(payloads))
    tampered = tmp_path / "tampered.parquet"
    with pq.ParquetWriter(tampered, changed.schema) as writer:
        writer.write_table(changed)
        writer.add_key_value_metadata({k: v for k, v in metadata.items() if k != b"ARROW:schema"})
    status, report = await audit_cli(capsys, tampered)
    assert status == 1
    (mismatch,) = [f for f in report["findings"] if f["check"] == "hash_mismatch"]
    assert mismatch["event"]["stream_id"] == stream_of(SEARCH) and mismatch["event"]["stream_version"] == 4
    assert mismatch["line"] == 5  # header is 1, so the fourth event is record 5
    assert "digest" in checks(report)


# -- any changed byte is found, and named ----------------------------------------------------------------------


async def test_every_single_byte_change_of_a_jsonl_export_fails_and_names_its_line(
    log: EventStore, tmp_path: Path
) -> None:
    original = await export_bytes(log, None)
    line_of = line_numbers(original)
    last_line = line_of[-1]
    rng = random.Random(20240611)
    path = tmp_path / "flipped.jsonl"
    for offset in rng.sample(range(len(original)), 300):
        flipped = bytearray(original)
        flipped[offset] ^= rng.randrange(1, 256)
        path.write_bytes(bytes(flipped))
        report = audit_export(path)
        assert not report.intact, f"byte {offset} changed, audit intact"
        line = line_of[offset]
        lines = {finding.line for finding in report.findings}
        if 1 < line < last_line:  # an event: named by its own line (and, when readable, its stream and version)
            assert line in lines, (offset, [str(f) for f in report.findings])


def line_numbers(data: bytes) -> list[int]:
    """The 1-based line each byte of ``data`` is on (a newline belongs to the line it ends)."""
    numbers, line = [], 1
    for byte in data:
        numbers.append(line)
        line += byte == 0x0A
    return numbers


@pytest.fixture
async def exported(log: EventStore, tmp_path: Path) -> Path:
    path = tmp_path / "search.jsonl"
    path.write_bytes(await export_bytes(log, SEARCH))
    return path


def edited(path: Path, change: Any) -> Path:
    """A copy of the export with its lines (bytes, newline kept) passed through ``change``."""
    lines = path.read_bytes().splitlines(keepends=True)
    copy = path.with_name(f"edited-{change.__name__}.jsonl")
    copy.write_bytes(b"".join(change(lines)))
    return copy


def change_field(line: bytes, name: str, value: Any) -> bytes:
    record = json.loads(line)
    record[name] = value
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def test_targeted_changes_are_named_by_event_and_check(
    exported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def payload_value(lines: list[bytes]) -> list[bytes]:
        text = json.loads(lines[3])["payload"]
        assert '"n": 10,' in text  # the third event: batch 1, first of two
        return [*lines[:3], change_field(lines[3], "payload", text.replace('"n": 10,', '"n": 17,')), *lines[4:]]

    def hash_value(lines: list[bytes]) -> list[bytes]:
        return [*lines[:5], change_field(lines[5], "hash", "f" * 64), *lines[6:]]

    def removed(lines: list[bytes]) -> list[bytes]:
        return [*lines[:4], *lines[5:]]

    def swapped(lines: list[bytes]) -> list[bytes]:
        return [*lines[:2], lines[3], lines[2], *lines[4:]]

    def truncated(lines: list[bytes]) -> list[bytes]:
        data = b"".join(lines)
        return [data[: len(data) * 2 // 3]]

    def header_head(lines: list[bytes]) -> list[bytes]:
        header = json.loads(lines[0])
        header["streams"][0]["hash"] = "0" * 64
        return [change_field(lines[0], "streams", header["streams"]), *lines[1:]]

    def export_time(lines: list[bytes]) -> list[bytes]:
        return [lines[0].replace(b'"exported_at":"2', b'"exported_at":"1'), *lines[1:]]

    def appended(lines: list[bytes]) -> list[bytes]:
        return [*lines, lines[1]]

    def spacing(lines: list[bytes]) -> list[bytes]:
        return [*lines[:6], lines[6].replace(b'"type":', b'"type": '), *lines[7:]]

    # change -> the checks it must fail, and the (stream version, position) of the event named, if any
    cases: list[tuple[Any, set[str], int | None]] = [
        (payload_value, {"hash_mismatch", "digest"}, 3),
        (hash_value, {"hash_mismatch", "chain_broken", "digest"}, 5),
        (removed, {"version_gap", "chain_broken", "header", "end", "digest"}, 5),
        (swapped, {"position_order", "version_gap", "chain_broken"}, 3),
        (truncated, {"end", "header"}, None),
        (header_head, {"header", "digest"}, 8),
        (export_time, {"digest"}, None),
        (appended, {"trailing_data"}, None),
        (spacing, {"altered_text", "digest"}, 6),
    ]
    positions = {
        json.loads(line)["stream_version"]: json.loads(line)["position"]
        for line in exported.read_bytes().splitlines()[1:-1]
    }
    for change, expected, version in cases:
        status, report = await audit_cli(capsys, edited(exported, change))
        assert status == 1, change.__name__
        assert expected <= checks(report), (change.__name__, checks(report))
        if version is not None:
            named = [f["event"] for f in report["findings"] if f["event"]]
            assert {
                "stream_id": stream_of(SEARCH),
                "stream_version": version,
                "position": positions[version],
            }.items() <= named[0].items(), (change.__name__, named)


async def test_text_report_names_the_event_and_check(exported: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def hash_value(lines: list[bytes]) -> list[bytes]:
        return [*lines[:2], change_field(lines[2], "hash", "a" * 64), *lines[3:]]

    status, out, _ = await asyncio.to_thread(kf_main, capsys, "audit", "--file", str(edited(exported, hash_value)))
    assert status == 1
    assert "BROKEN" in out
    assert f"line 3, event '{stream_of(SEARCH)}/0/1'" in out and "hash mismatch" in out, out
    assert f"(stream '{stream_of(SEARCH)}' v2, position 2): hash mismatch" in out
    assert "line 4" in out and "chain broken" in out


async def test_a_consistent_rewrite_passes_offline_but_moves_the_head(exported: Path) -> None:
    """What the file alone cannot show: whoever rewrites an event and re-hashes everything after it passes the
    offline checks. Only the head differs, which is why the audit points at the witness (`kf audit ID`)."""
    lines = exported.read_bytes().splitlines(keepends=True)
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:-1]]
    records[2]["payload"] = records[2]["payload"].replace('"n": 10,', '"n": 99,')
    previous = None
    for record in records:
        record["prev_hash"] = previous or record["prev_hash"]
        record["hash"] = event_hash(
            prev_hash=record["prev_hash"],
            position=record["position"],
            event_id=record["event_id"],
            stream_id=record["stream_id"],
            stream_version=record["stream_version"],
            type=record["type"],
            schema_version=record["schema_version"],
            recorded_at=datetime.fromisoformat(record["recorded_at"]),
            payload_text=record["payload"],
            metadata_text=record["metadata"],
        )
        previous = record["hash"]
    original_head = header["streams"][0]["hash"]
    header["streams"][0]["hash"] = previous
    digest = ExportDigest()
    body = [compact(header), *(compact(record) for record in records)]
    for line in body:
        digest.add(line)
    end = {"kind": "kf-evidence-export-end", "events": len(records), "digest": digest.hexdigest()}
    forged = exported.with_name("forged.jsonl")
    forged.write_bytes(b"".join(body) + compact(end))
    report = audit_export(forged)
    assert report.intact, [str(f) for f in report.findings]
    assert report.streams[0].hash != original_head


def compact(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def test_online_and_offline_audits_name_the_same_changed_event(
    log: EventStore, pg_url: str, fresh_db_url: str, tmp_path: Path
) -> None:
    """The owner rewrites a payload in the database (the append-only trigger disabled): both audits find it."""
    target = (await log.read_stream(stream_of(OTHER)))[4]
    connection = await asyncpg.connect(fresh_db_url)
    try:
        await connection.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
        await connection.execute(
            """UPDATE events SET payload = jsonb_set(payload, '{n}', '"rewritten"') WHERE event_id = $1""",
            target.event_id,
        )
    finally:
        await connection.close()
    online = await log.verify()
    assert online is not None and online.problem == "hash_mismatch" and online.event_id == target.event_id
    path = tmp_path / "log.jsonl"
    path.write_bytes(await export_bytes(log, None))
    report = audit_export(path)
    first = report.findings[0]
    assert first.check == "hash_mismatch" and first.event is not None
    assert (first.event.event_id, first.event.position) == (online.event_id, online.position)
    assert first.expected == online.expected  # the same recomputed hash, offline and in the database


# -- bad input, and the machine failing ---------------------------------------------------------------------


async def test_files_that_are_not_exports_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "notes.jsonl").write_text('{"kind": "something else"}\nhello\n')
    (tmp_path / "export.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00rest")
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "foreign.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    cases = {
        str(tmp_path / "missing.jsonl"): "no such file",
        str(tmp_path): "not a regular file",
        str(tmp_path / "empty.jsonl"): "is empty",
        str(tmp_path / "notes.jsonl"): "not a kf evidence export",
        str(tmp_path / "export.jsonl.gz"): "gunzip",
        str(tmp_path / "foreign.parquet"): "no kf_export metadata",
        str(tmp_path / "junk.parquet"): "cannot be read as Parquet",
    }
    for path, message in cases.items():
        status, out, err = await asyncio.to_thread(kf_main, capsys, "audit", "--file", path)
        assert status == 2 and message in err and not out, (path, err)
    status, _, err = await asyncio.to_thread(kf_main, capsys, "audit", SEARCH, "--file", str(tmp_path / "x"))
    assert status == 2 and "takes no search id" in err


async def test_export_refusals_and_an_unreachable_database(
    log: EventStore,
    fresh_db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KF_DATABASE_URL", fresh_db_url)
    refusals = {
        ("export",): "a search id, or --all",
        ("export", SEARCH, "--all"): "a search id, or --all",
        ("export", "no-such-search"): "no events for search 'no-such-search'",
        ("export", SEARCH, "-o", str(tmp_path)): "is a directory",
        ("export", SEARCH, "-o", str(tmp_path / "nowhere" / "x.jsonl")): "does not exist",
        # /proc passes os.access for root and refuses every new file; /dev/null is a file, not a folder
        ("export", SEARCH, "-o", "/proc/kf-export.jsonl"): "/proc cannot hold a new file",
        ("export", SEARCH, "-o", "/dev/null/x.jsonl"): "/dev/null is not a folder",
    }
    for argv, message in refusals.items():
        status, _, err = await asyncio.to_thread(kf_main, capsys, *argv)
        assert status == 2 and message in err, (argv, err)

    # Nothing listens on port 1 of the loopback: the machine failed, not the input (exit 3), and no file is left.
    monkeypatch.setenv("KF_DATABASE_URL", "postgresql://kf@127.0.0.1:1/kf")
    out = tmp_path / "never.jsonl"
    status, _, err = await asyncio.to_thread(kf_main, capsys, "export", "--all", "-o", str(out))
    assert status == 3 and "cannot connect to Postgres" in err, err
    assert not out.exists() and not list(tmp_path.glob(".*"))  # nor a partial one


def test_parquet_is_not_written_to_a_terminal(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    try:
        env = os.environ | {"KF_DATABASE_URL": "postgresql://kf@127.0.0.1:1/kf"}
        done = subprocess.run(
            [KF, "export", "--all", "--format", "parquet"], stdout=terminal, stderr=subprocess.PIPE, env=env, timeout=60
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 2
    assert b"--output FILE" in done.stderr and b"terminal" in done.stderr


async def test_parquet_goes_to_a_pipe(log: EventStore, fresh_db_url: str, tmp_path: Path) -> None:
    env = os.environ | {"KF_DATABASE_URL": fresh_db_url}
    done = await asyncio.to_thread(
        subprocess.run, [KF, "export", SEARCH, "--format", "parquet"], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    path = tmp_path / "piped"
    path.write_bytes(done.stdout)
    report = audit_export(path)
    assert report.intact and report.format == "parquet" and report.events == 8


@pytest.mark.parametrize("file_format", ["jsonl", "parquet"])
async def test_an_export_to_a_named_pipe_is_written_into_it_not_over_it(
    log: EventStore, fresh_db_url: str, tmp_path: Path, file_format: str
) -> None:
    # A pipe (as /dev/stdout or a terminal) is a place to write into: renaming a finished file over it would
    # remove the pipe its reader waits on and leave the export in a file nobody reads.
    pipe = tmp_path / "evidence.pipe"
    os.mkfifo(pipe)
    env = os.environ | {"KF_DATABASE_URL": fresh_db_url}
    command = [KF, "export", SEARCH, "--format", file_format, "--output", str(pipe)]
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    # Our own writer holds the pipe open, so that its end of file comes only after the export has had its turn
    # (an export that never opens the pipe must not leave the reader waiting).
    keeper = os.open(pipe, os.O_WRONLY)
    os.set_blocking(reader, True)

    def read() -> bytes:
        chunks = []
        while chunk := os.read(reader, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)

    reading = asyncio.ensure_future(asyncio.to_thread(read))
    exporting = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    ended = await asyncio.to_thread(exporting.wait, 60)
    os.close(keeper)
    received = await reading
    os.close(reader)
    err = exporting.stderr.read() if exporting.stderr else b""
    assert ended == 0, err.decode()
    assert stat.S_ISFIFO(pipe.stat().st_mode), "the pipe was replaced by a file"
    copy = tmp_path / f"received.{file_format}"
    copy.write_bytes(received)
    report = audit_export(copy)
    assert report.intact and report.format == file_format and report.events == 8
    assert not list(tmp_path.glob(".kf-*")), "a temporary file was left beside the pipe"
