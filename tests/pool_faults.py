"""A fingerprinting function for the pool tests: it takes its process down on a page that
asks for it (as a crash in a C extension, or the OOM killer, would), else fingerprints as the
worker does.  A module of its own: the pool's spawned processes import it by name."""

from __future__ import annotations

import os

from streamdedup.pipeline.intake import fingerprint_contents

KILL = "KILL-THE-PROCESS"


def _text(content) -> str:
    """A content as the pool gets it: a str, bytes, or a record's UTF-8 (Utf8Text)."""
    raw = getattr(content, "data", content)
    return raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")


def fingerprint_or_die(contents, *args):
    if any(KILL in _text(content) for content, _, _ in contents):
        os._exit(9)
    return fingerprint_contents(contents, *args)
