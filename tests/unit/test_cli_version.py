"""The habits of every command-line tool: --version, -h, shell completion."""
import re

from meshscale.cli import app


def test_version_prints_the_package_version(cli):
    result = cli("--version")
    assert result.exit_code == 0
    assert re.fullmatch(r"meshscale \d+\.\d+\.\d+\S*\n", result.stdout), result.stdout


def test_short_help_works_on_the_app_and_a_subcommand(cli):
    top = cli("-h")
    assert top.exit_code == 0 and "Usage:" in top.stdout and "bench" in top.stdout
    sub = cli("bench", "collective", "-h")
    assert sub.exit_code == 0 and "--min-bytes" in sub.stdout


def test_shell_completion_is_offered(cli):
    assert app._add_completion is True
    assert "--install-completion" in cli("--help").stdout
