"""Every usage error the parser finds (an unknown command or option, a missing or extra argument, a value it
cannot read) is meshscale's one line on stderr and exit 2, in every command: never click's usage block."""
import pytest
import typer

from meshscale.cli import app


def _commands(command, words=()):
    """(words, click command) for every leaf command of the app, groups walked."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*words, name))
    else:
        yield words, command


COMMANDS = list(_commands(typer.main.get_command(app)))
WITH_ARGUMENTS = [(words, c) for words, c in COMMANDS if any(p.param_type_name == "argument" and p.required for p in c.params)]


def _int_option(command):
    """The first --long option that takes an int, or None."""
    return next((o for p in command.params if p.param_type_name == "option" and p.type_descriptor.annotation is int
                 for o in p.opts if o.startswith("--")), None)


INT_OPTIONS = [(words, _int_option(c)) for words, c in COMMANDS if _int_option(c)]


def assert_one_usage_line(result, *mentions: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("meshscale: error:"), lines
    assert "Usage:" not in result.output
    for text in mentions:
        assert text in lines[0], lines


def test_the_walk_finds_the_commands():
    assert len(COMMANDS) > 10 and WITH_ARGUMENTS and INT_OPTIONS  # the cases below cover something


@pytest.mark.parametrize("words,command", COMMANDS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_an_unknown_option_is_one_line(cli, words, command):
    result = cli(*words, "--no-such-option-x")
    if command.context_settings.get("ignore_unknown_options"):  # `launch` hands options on to torchrun: its own line
        assert_one_usage_line(result)
    else:
        assert_one_usage_line(result, "--no-such-option-x", f"meshscale {' '.join(words)} -h")


@pytest.mark.parametrize("words", [w for w, _ in WITH_ARGUMENTS], ids=" ".join)
def test_a_missing_argument_is_one_line(cli, words):
    assert_one_usage_line(cli(*words), "Missing")


@pytest.mark.parametrize("words,option", INT_OPTIONS, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_value_of_the_wrong_kind_is_one_line(cli, words, option):
    assert_one_usage_line(cli(*words, option, "two\nlines"), option)


@pytest.mark.parametrize("args", [("no-such-command",), ("bench", "no-such-command"), ("topo", "extra", "args"),
                                  ("topo", "--output"), ("why-hung", ".", "extra")], ids=" ".join)
def test_commands_extra_arguments_and_missing_values_are_one_line(cli, args):
    assert_one_usage_line(cli(*args))


def test_help_is_left_as_it_is(cli):
    result = cli("topo", "-h")
    assert result.exit_code == 0 and "Usage:" in result.stdout and result.stderr == ""
