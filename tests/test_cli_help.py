"""Help that teaches: ``streamdedup --help`` shows whole command summaries, every command's
``--help`` lists only the options that command uses, explains each of them, and ends with an
example of the command."""

from __future__ import annotations

import re
import shlex

import click
import pytest
from click.testing import CliRunner

from streamdedup.cli import main
from streamdedup.settings import Settings

#: Settings flags that change what the crawler-side commands do.  The connection: every command
#: that talks to Kafka; then each one's own topics.  Written out here as the specification.
CONNECTION_FLAGS = {
    "--brokers",
    "--security-protocol",
    "--sasl-mechanism",
    "--sasl-username",
    "--sasl-password",
    "--sasl-password-file",
    "--ssl-cafile",
    "--ssl-certfile",
    "--ssl-keyfile",
    "--ssl-key-password",
    "--ssl-check-hostname",
    "--no-ssl-check-hostname",
    "--log-level",
}
OWN_FLAGS = {
    "produce": CONNECTION_FLAGS
    | {"--pages-topic", "--max-page-bytes", "--input-format", "--progress", "--no-progress"},
    "verdicts": CONNECTION_FLAGS
    | {
        "--until-end",
        "--verdicts-topic",
        "--unique-topic",
        "--near-duplicate-topic",
        "--dead-letter-topic",
        "--topic",
        "--format",
        "--from-beginning",
        "--max",
        "--timeout",
    },
}
#: What the worker alone uses: never in a crawler-side command's help.
WORKER_ONLY = {"--k", "--design", "--num-perm", "--data-dir", "--web-port", "--partitions", "--app-id", "--threshold"}


def help_text(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def listed_flags(text: str) -> set[str]:
    options = text.split("\nOptions:\n", 1)[1]
    return set(re.findall(r"(?:^|[\s,/])(--[a-z][a-z-]*)", options.split("\n\n")[0], flags=re.M))


def test_the_command_list_has_whole_summaries():
    text = help_text()
    commands = text.split("\nCommands:\n", 1)[1].split("\n\n")[0]
    summaries = re.findall(r"^  (\w+)\s+(.+(?:\n {4,}\S.*)*)", commands, flags=re.M)
    assert {name for name, _ in summaries} == set(main.commands)
    for name, summary in summaries:
        summary = " ".join(summary.split())
        assert summary.endswith(".") and "..." not in summary, f"{name}: {summary!r} is cut"
        assert summary == main.commands[name].short_help


@pytest.mark.parametrize("command", ["produce", "verdicts"])
def test_crawler_commands_list_only_their_options(command):
    flags = listed_flags(help_text(command)) - {"--help"}
    assert flags == OWN_FLAGS[command]
    assert not flags & WORKER_ONLY


def test_the_worker_lists_every_setting():
    flags = listed_flags(help_text("worker"))
    assert {f.metadata["flag"] for f in Settings.__dataclass_fields__.values()} <= flags


@pytest.mark.parametrize("command", [None, *sorted(main.commands)])
def test_every_help_ends_with_an_example_of_the_command(command):
    args = [command] if command else []
    text = help_text(*args)
    tail = text.rstrip().split("\n\n")[-1].strip().splitlines()
    assert tail[0].strip() in ("Example:", "Examples:"), f"{command or 'streamdedup'} --help ends with {tail!r}"
    examples = [line.strip() for line in tail[1:]]
    assert examples
    for example in examples:
        words = shlex.split(example.split("|")[-1].split(">")[0].split("#")[0])
        while words and "=" in words[0]:  # VAR=value before the command
            words.pop(0)
        assert words[0] == "streamdedup", example
        if command:
            assert words[1] == command, example
        # every flag of the example is one of the command's options
        opts = {o for p in main.commands[words[1]].params for o in (*p.opts, *p.secondary_opts)}
        assert {w for w in words[2:] if w.startswith("-") and w != "-"} <= opts, example


def test_every_option_is_explained():
    for name, cmd in main.commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert p.help and len(p.help) > 15, f"{name} {p.opts[0]} has no help"
    scan = help_text("scan")
    for words in (
        ["simhash", "minhash", "combined", "trigrams"],  # --algorithm
        ["jsonl", "warc", "first bytes"],  # --input-format
        ["fingerprinted and judged together"],  # --batch-size
        ["too_large"],  # --max-page-bytes
    ):
        assert all(w in " ".join(scan.split()) for w in words), words


@pytest.mark.parametrize("gz", [False, True])
def test_scan_progress_has_a_total_for_a_file(tmp_path, gz):
    import gzip
    import json

    lines = "".join(json.dumps({"url": f"http://a/{i}", "content": f"page {i} " * 50}) + "\n" for i in range(300))
    path = tmp_path / ("pages.jsonl.gz" if gz else "pages.jsonl")
    path.write_bytes(gzip.compress(lines.encode()) if gz else lines.encode())
    result = CliRunner().invoke(main, ["scan", str(path), "-o", str(tmp_path / "v.jsonl"), "--progress"])
    assert result.exit_code == 0, result.output
    size = path.stat().st_size
    bars = [b for b in re.split(r"[\r\n]", result.output) if "%|" in b]
    assert bars and "100%" in bars[-1] and "300 records" in bars[-1], bars[-1:]
    from tqdm import tqdm

    assert f"/{tqdm.format_sizeof(size)} [" in bars[-1], (size, bars[-1])  # the total is the file's size
    assert len((tmp_path / "v.jsonl").read_text().splitlines()) == 300
