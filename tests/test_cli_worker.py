"""`streamdedup worker` refuses bad settings with a message that says how to fix them (exit 2),
and an unreachable cluster with one line (exit 1) — never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from streamdedup.cli import main


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--partitions", "0"], {}, "--partitions / STREAMDEDUP_PARTITIONS: 0 is out of range; use at least 1"),
        (
            ["--algorithm", "minhash", "--threshold", "0.01"],
            {},
            "no banding of 512 permutations reaches threshold 0.01",
        ),
        (["--design", "7"], {}, "'7' is not one of 20|16|10|4"),
        ([], {"STREAMDEDUP_BROKERS": "nope"}, "'nope' is not host:port; use e.g. 127.0.0.1:9092"),
        ([], {"STREAMDEDUP_PARTITONS": "4"}, "did you mean STREAMDEDUP_PARTITIONS?"),
        (["--security-protocol", "SASL_SSL"], {}, "--sasl-mechanism / STREAMDEDUP_SASL_MECHANISM: is required"),
    ],
)
def test_bad_settings_exit_2_with_a_fix(args, env, message):
    result = CliRunner().invoke(main, ["worker", *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_one_line_and_exit_1(tmp_path):
    # (a free web port: the default one may be a running worker's, which is checked first)
    args = ["--brokers", "127.0.0.1:1", "--data-dir", str(tmp_path), "--web-port", str(_free_port())]
    result = CliRunner().invoke(main, ["worker", *args])
    assert result.exit_code == 1
    assert "cannot connect to Kafka at 127.0.0.1:1" in result.output and "check --brokers" in result.output
    assert "Traceback" not in result.output


def test_a_web_port_in_use_is_one_line_before_anything_is_created(tmp_path):
    """(faust found out after the topics were created: an OSError traceback.)"""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main, ["worker", "--brokers", "127.0.0.1:1", "--data-dir", str(tmp_path), "--web-port", str(port)]
        )
    assert result.exit_code == 1 and "Traceback" not in result.output
    [line] = result.output.splitlines()
    assert (
        f"--web-port / STREAMDEDUP_WEB_PORT: cannot listen on 127.0.0.1:{port}" in line and "pick a free port" in line
    )


def test_a_web_host_that_does_not_resolve_is_one_line(tmp_path):
    result = CliRunner().invoke(
        main, ["worker", "--brokers", "127.0.0.1:1", "--data-dir", str(tmp_path), "--web-host", "no.such.host.invalid"]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--web-host / STREAMDEDUP_WEB_HOST: cannot resolve 'no.such.host.invalid'" in result.output
