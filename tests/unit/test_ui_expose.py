"""The dashboard binds 127.0.0.1 unless told, in so many words, to expose itself."""

from __future__ import annotations

from click.testing import CliRunner

from substreams.cli.ui_cmd import command, loopback


def test_a_non_loopback_host_needs_expose_and_says_what_it_would_expose() -> None:
    result = CliRunner().invoke(command, ["-c", "absent.yaml", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "--host 0.0.0.0" in result.output and "add --expose" in result.output
    assert "every record of every stream" in result.output
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("10.0.0.5") and not loopback("example.org")
