"""``--breaker-max-share``, ``--breaker-window``, ``--breaker-min-population``: one set of
options for ``trainguard run`` and ``trainguard serve`` (decision 0375), checked by
``BreakerConfig``'s own rule, and carried to where each mode asks the breaker."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from trainguard.api.wiring import ServeOptions, build_control
from trainguard.cli import build_parser
from trainguard.policy.breaker import BreakerConfig
from trainguard.store import Store

GIVEN = ["--breaker-max-share", "0.5", "--breaker-window", "600", "--breaker-min-population", "2"]
WANT = BreakerConfig(max_share=0.5, window_seconds=600.0, min_population=2)


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _command(name: str, options: list[str]) -> list[str]:
    return [name, *options, "--", "true"] if name == "run" else [name, *options]


@pytest.mark.parametrize("command", ["run", "serve"])
def test_both_commands_parse_the_same_breaker(command: str) -> None:
    from trainguard._commands._common import breaker_config

    assert breaker_config(_parse(_command(command, GIVEN))) == WANT
    # Not given: BreakerConfig's defaults, not a second copy of them.
    assert breaker_config(_parse(_command(command, []))) == BreakerConfig()
    one = breaker_config(_parse(_command(command, ["--breaker-max-share", "1"])))
    assert one == BreakerConfig(max_share=1.0)


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--breaker-max-share", "0", "max_share must be in (0, 1], got 0"),
        ("--breaker-max-share", "1.5", "max_share must be in (0, 1], got 1.5"),
        ("--breaker-max-share", "nan", "max_share must be in (0, 1], got nan"),
        ("--breaker-window", "0", "window_seconds must be > 0, got 0"),
        ("--breaker-window", "nan", "window_seconds must be > 0, got nan"),
        ("--breaker-min-population", "-1", "min_population must be >= 0, got -1"),
        ("--breaker-min-population", "2.5", "invalid literal for int()"),
        ("--breaker-max-share", "a lot", "could not convert string to float"),
    ],
)
def test_an_out_of_range_value_is_a_usage_error_naming_the_flag(
    command: str, flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(_command(command, [flag, value]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"trainguard {command}: error: argument {flag}: " in err, err
    assert says in err, err


def test_breaker_config_refuses_what_the_options_refuse() -> None:
    # The options' check is this one; a config built in code is held to it too.
    for bad in (
        {"max_share": math.nan},
        {"window_seconds": math.nan},
        {"window_seconds": -1.0},
        {"min_population": -1},
    ):
        with pytest.raises(ValueError):
            BreakerConfig(**bad)


def test_run_passes_the_breaker_to_its_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainguard.controller.local_driver as run_module

    seen: list[Any] = []

    class Stub:
        def __init__(self, options: Any) -> None:
            seen.append(options)

        def run(self) -> Any:
            return argparse.Namespace(exit_code=0)

    monkeypatch.setattr(run_module, "LocalDriver", Stub)
    args = _parse(_command("run", GIVEN))
    assert args.func(args) == 0
    [options] = seen
    assert options.breaker == WANT


def test_serve_options_carry_the_breaker_to_the_loop_process_and_its_controller(
    tmp_path: Path,
) -> None:
    args = _parse(_command("serve", GIVEN))
    from trainguard._commands._common import breaker_config

    options = ServeOptions(database=str(tmp_path / "state.db"), breaker=breaker_config(args))
    # The reconcile loop runs in a child process: its options travel as JSON.
    travelled = ServeOptions.from_json(json.loads(json.dumps(options.to_json())))
    assert travelled == options and travelled.breaker == WANT
    with Store.open(options.database) as store:
        control = build_control(store, travelled, lambda: 0.0)
        assert control is not None
        assert control.config.breaker == WANT
