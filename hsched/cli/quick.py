"""Reading a command's options without Typer, for the quick paths of hsched/cli/__init__.py (`submit`, `queue`).

A quick path parses only what is plain: long options (`--gpus 4`, `--gpus=4`), short ones with their value
apart (`-G 4`), flags, `--` and then arguments. It declines (None) whatever Typer would read differently or
refuse: an unknown option (-h and --help included), a short option with its value attached (`-G4`), flags run
together (`-ab`), an option given twice, a flag with a value, a missing value, a value that starts with `-`, a
number that is not plain digits or is out of range. Typer then parses the argv as it always did, its usage
errors included, so a quick path changes how fast a command answers, never what it says. Each command's table
is held to its Typer declaration by a test (tests/cli/test_quick_submit.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is left to the type checker: a quick path does without its import
if TYPE_CHECKING:
    from typing import Any

INT, TEXT, MANY, FLAG = "int", "text", "many", "flag"



def _integer(text: str, low: int | None, high: int | None) -> int | None:
    """`text` as Typer would read it, when it is plainly a number in range; None when Typer must decide."""
    if not (text.isascii() and text.isdigit()):
        return None  # signs, spaces, underscores, words: Typer converts them or says what is wrong
    value = int(text)
    if (low is not None and value < low) or (high is not None and value > high):
        return None
    return value


def parse(argv: list[str], options: dict[str, tuple[tuple[str, ...], str, int | None, int | None]]
          ) -> tuple[dict[str, Any], list[str]] | None:
    """(parameters as Typer would pass them, the arguments after the options) for a plain argv; None when in
    doubt. Options end at `--` (dropped, as Typer drops it) or at the first argument, as with Typer's
    allow_interspersed_args=False."""
    by_option = {opt: name for name, (opts, *_rest) in options.items() for opt in opts}
    params: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        opt, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        name = by_option.get(opt)
        if name is None or (name in params and options[name][1] != MANY):
            return None  # unknown (or -h, -G4, -abc), or given twice: Typer's to read or refuse
        _opts, kind, low, high = options[name]
        if kind == FLAG:
            if eq:
                return None
            params[name] = True
            i += 1
            continue
        if eq:
            value = attached
            i += 1
        else:
            if i + 1 >= len(argv):
                return None  # "requires an argument": Typer says it
            value = argv[i + 1]
            i += 2
        if value.startswith("-"):
            return None  # a negative number or a word like an option: Typer's rules
        if kind == INT:
            number = _integer(value, low, high)
            if number is None:
                return None
            params[name] = number
        elif kind == MANY:
            params.setdefault(name, []).append(value)
        else:
            params[name] = value
    for name, (_opts, kind, _low, _high) in options.items():
        params.setdefault(name, False if kind == FLAG else [] if kind == MANY else None)
    return params, argv[i:]


def run(fn: Any, *args: Any) -> int:
    """Run a quick path's command and return the contract's exit code: hsched's errors as one line each (as
    handle_errors and hsched/cli/_app.py's run() say them); anything else propagates as it would there."""
    from hsched.cli._common import EXIT_OK, exit_code_of, permission_problem

    try:
        fn(*args)
    except BaseException as e:
        if isinstance(e, PermissionError):
            return permission_problem(e)
        code = exit_code_of(e)
        if code is None:
            raise
        return code
    return EXIT_OK
