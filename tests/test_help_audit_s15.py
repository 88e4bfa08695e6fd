"""`tilesim ... --help` states every default it applies (docs audit, session 15)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from simulator.cli import build_parser


def _commands(
    parser: argparse.ArgumentParser, prefix: str = "tilesim"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


def _options_with_defaults() -> list[tuple[str, str]]:
    found = []
    for prog, parser in _commands(build_parser()):
        for a in parser._actions:
            flag = a.option_strings[-1] if a.option_strings else None
            if flag is None or a.nargs == 0:  # positionals, --help, --json-like switches
                continue
            if a.default in (None, [], argparse.SUPPRESS):
                continue
            found.append((prog, flag))
    return found


@pytest.mark.parametrize(("command", "flag"), _options_with_defaults())
def test_help_states_the_default(command: str, flag: str) -> None:
    parser = dict(_commands(build_parser()))[command]
    action = next(a for a in parser._actions if flag in a.option_strings)
    assert "default" in (action.help or "").lower(), f"{command} {flag}: help omits its default"


def _help(command: str, flag: str) -> str:
    parser = dict(_commands(build_parser()))[command]
    action = next(a for a in parser._actions if flag in a.option_strings)
    return " ".join((action.help or "").split())


@pytest.mark.parametrize(
    ("command", "flag", "said"),
    [
        # no value given means something: say what
        ("tilesim kernels collect", "--dtypes", "default: all"),
        ("tilesim kernels collect", "--budget-s", "default: no limit"),
        ("tilesim kernels tc-calibrate", "--data", "default: "),
        ("tilesim serve", "--gpu", "default: --server's"),
        # a choice the handler checks itself lists what it takes, not "..."
        ("tilesim collective", "--op", "all-to-all | send-recv"),
        ("tilesim predict", "--runs", "model, gpu, batch, seq, mode, framework, dtype"),
    ],
)
def test_help_says_what_no_value_means(command: str, flag: str, said: str) -> None:
    assert said in _help(command, flag)


def test_serve_help_names_tensor_parallelism() -> None:
    # `tilesim serve --tp N --server ID` shards over N GPUs; the command list said "one GPU"
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = next(c.help for c in sub._choices_actions if c.dest == "serve")
    assert text is not None and "--tp" in text
