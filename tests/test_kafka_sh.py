"""deploy/local/kafka.sh's own helpers, called from the script itself (sourced)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "local" / "kafka.sh"


def test_cluster_ids_never_start_with_a_dash_and_are_kafka_uuids():
    """kafka-storage's argument parser takes an id starting with "-" for an option, and the
    broker never started (1 fresh format in 64); Kafka's own Uuid.randomUuid avoids them."""
    out = subprocess.run(
        ["bash", "-c", 'source "$1" && for _ in $(seq 3000); do new_cluster_id; done', "kafka.sh", str(SCRIPT)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert len(out) == 3000 and len(set(out)) == 3000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in out), [i for i in out if i.startswith("-")][
        :3
    ]
