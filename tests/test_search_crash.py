"""A search survives its worker being SIGKILLed at random points, with an exact record.

The worker here is a real `kf worker` process; it is killed (SIGKILL, no goodbye) three times at random
moments and restarted. The search must complete with exactly one outcome per (candidate, step), an intact
hash chain, and no candidate benchmarked twice.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from search_fixtures import COPY_PROBLEM, QUICK, start
from temporalio.client import Client

from engine.evidence.store import EventStore
from engine.search.history import STEP_EVENTS, stream_of

pytestmark = pytest.mark.slow
KF = str(Path(sys.executable).with_name("kf"))


def spawn_worker(env: dict[str, str], prefix: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([KF, "worker", "--prefix", prefix], env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_search_survives_sigkilled_workers(
    client: Client, store: EventStore, fresh_db_url: str, prefix: str, tmp_path: Path
) -> None:
    env = dict(os.environ)
    env["KF_DATABASE_URL"] = fresh_db_url  # the database `store` was built on
    env["KF_TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["KF_HOME"] = str(tmp_path / "kf-home")
    log = tmp_path / "worker.log"
    rng = random.Random(20261130)

    worker = spawn_worker(env, prefix, log)
    try:
        handle = await start(
            client, prefix, {"problem": COPY_PROBLEM, "generations": 2, "candidates_per_generation": 3, **QUICK}
        )
        kills = 0
        while kills < 3:
            await asyncio.sleep(rng.uniform(1.0, 5.0))
            if (await handle.describe()).status is not None and (await handle.describe()).close_time:
                break
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            worker = spawn_worker(env, prefix, log)
        result = await asyncio.wait_for(handle.result(), timeout=400)
    finally:
        worker.kill()
        worker.wait()

    assert kills == 3, f"the search finished before three kills ({kills}); make it longer"
    assert result.status == "completed"
    events = await store.read_stream(stream_of(handle.id))
    steps = Counter((e.payload["candidate_id"], e.type) for e in events if e.type in STEP_EVENTS)
    assert max(steps.values()) == 1, steps.most_common(3)
    benchmarked = [cid for cid, step in steps if step == "candidate.benchmarked"]
    assert len(benchmarked) == len(set(benchmarked))
    compiled = {cid for cid, step in steps if step == "candidate.compiled"}
    assert len(compiled) == result.candidates_done == 7
    assert await store.verify(stream_of(handle.id)) is None
    # Several worker processes wrote the record.
    assert len({e.metadata["worker"] for e in events if "worker" in e.metadata}) >= 2
