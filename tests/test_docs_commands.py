"""Every ``medrt ...`` command the docs show is one the CLI takes, every ``python -m
medrt.models.X ...`` (the training recipe: train, ensemble, evaluate, ceiling, thin) one
that script takes, and every ``make`` target they name is in the Makefile.

Clinicians and IT copy these lines; an option renamed or removed left them wrong with
nothing to say so. The commands are read from the markdown files (README.md, docs/,
models/, sample_dicom/) and from the installer's files an administrator edits or reads
(listen.env's options, the unit's ExecStart, install-listener.sh's hint), then parsed by
the real parser, ``medrt.cli.build_parser()``, or the script's own ``build_parser()`` for a
``python -m medrt.models.X`` line: argparse only, nothing runs (importing the scripts
imports torch, as they do).

What counts as a command, and how each is checked:

* fenced blocks (sh, console or none): a line whose command is ``medrt`` (after ``$ ``,
  ``VAR=value`` assignments, ``sudo -u USER``, ``/usr/bin/time -v``, a path such as
  ``.venv/bin/medrt``, or ``python -m medrt``; also after ``do``, ``;``, ``&&``, ``|``),
  with ``\\`` continuations joined and ``#`` comments dropped; likewise a line whose command
  is ``python -m medrt.models.X`` (its arguments may be none: ``evaluate``'s defaults). A
  line of assignments only (``LITE="python -m medrt.models.train ..."``) is remembered
  for the rest of its file, and a later ``$LITE`` as a whole word stands for its value
  (``OMP_NUM_THREADS=1 $LITE --out m0``). A gap of three or more
  spaces ends the command: what follows is a usage table's description. An indented line
  that starts with ``[`` continues the command above it (a wrapped synopsis).
* inline code spans that start with ``medrt `` or ``python -m medrt.models.X`` (or one of
  those launchers); a span such as
  ``medrt batch: cannot write ...`` (a word ending in ``:``) is a message medrt prints. A
  model card's resumed run names its first run's command after a colon in the span
  (``...; continuing the weights of a first run of N steps (S s): python -m ...``): that
  one is read too.
* a **synopsis** -- a command holding ``[``, ``...``, ``…`` or a ``|`` inside a word
  (``--png positive|all|none``) -- is checked for its names only: each (sub)command word,
  each script of ``medrt.models.train|evaluate``,
  each alternative of ``list|verify``, each option name, and each alternative given as an
  option's value where the option has choices. A number in brackets after an option
  (``[--idle 10]``) is the default the usage shows, and must be the parser's.
* every other command is parsed with ``parse_args`` as well, and its option names must be
  the full ones (argparse would take ``--keep-result`` for ``--keep-results-days``).
  Records of what was run once, whose option has since been removed, are skipped by
  ``HISTORICAL`` only (docs/models-log.md; the model cards and README must be current).
  Inline spans are shorthand in a sentence: they may leave out required arguments
  (``medrt batch heldout``), and a last option without its value (``medrt batch --ray``)
  is a mention of that option, checked by name.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from medrt.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = sorted({ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("models/*.md"),
                   ROOT / "sample_dicom" / "README.md"})
INSTALLER = ROOT / "installer"

# Spans that are placeholders only, with no command to check: keep this short.
PLACEHOLDERS = {
    "medrt COMMAND --help",  # any command's --help
}

# The training recipe's scripts: ``python -m medrt.models.X``, each with its build_parser().
SCRIPTS = ("train", "ensemble", "evaluate", "ceiling", "thin")

# Lines of docs/models-log.md that record what was run then, with an option removed since:
# history, not instructions, so they stay as they were. (file, the option) -> when it went.
# Keep this short; a model card or README line is never allowed here. Empty so far: no
# option of the five scripts has been removed (git log -p models/), only defaults changed.
# An entry: ("docs/models-log.md", "--option"): "removed in <commit> (<date>, <why>)".
HISTORICAL: dict[tuple[str, str], str] = {}

PYTHON = re.compile(r"(\S*/)?python3?")
SYNOPSIS_MARKS = re.compile(r"\[|\.\.\.|…|\S\|\S")
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}
WRAPPERS = {"sudo": {"-u"}, "time": set(), "/usr/bin/time": set(), "exec": set()}  # with options taking a value


@dataclass
class Command:
    where: str  # file:line
    words: list[str]  # after "medrt" (or "python -m medrt.models.X")
    inline: bool
    synopsis: bool
    program: str = "medrt"  # or "medrt.models.train", ...

    @property
    def shown(self) -> str:
        return " ".join([_display(self.program), *self.words])


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _display(program: str) -> str:
    return program if program == "medrt" else f"python -m {program}"


def _simple_commands(tokens: list[str]) -> Iterator[list[str]]:
    """Each simple command's words in one shell line's tokens, from the command's name on
    (the assignments and wrappers before it left out)."""
    simple: list[list[str]] = [[]]
    skip = False
    for tok in tokens:
        if skip:  # a redirection's file
            skip = False
        elif re.match(r"^\d?>>?|^<(?!.*>)", tok):  # "> base.json": not an argument
            skip = re.fullmatch(r"\d?>>?|<", tok) is not None
        elif tok in {";", "&&", "||", "|", "&", "do", "then", "done", "fi"}:
            simple.append([])
        elif tok.endswith(";") or (tok.endswith("&") and not tok.endswith("\\&")):
            simple[-1].append(tok.rstrip(";&"))
            simple.append([])
        else:
            simple[-1].append(tok)
    for words in simple:
        i = 0
        while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
            i += 1
        while i < len(words) and words[i] in WRAPPERS:
            takes_value = WRAPPERS[words[i]]
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in takes_value else 1
        if i < len(words):
            yield words[i:]


def _invocations(tokens: list[str], program: str) -> Iterator[list[str]]:
    """The argument lists ``program`` is run with in one shell line's tokens."""
    for words in _simple_commands(tokens):
        head = words[0]
        if head == program or re.search(rf"(^|/)(bin|{program})/{program}$", head):  # .venv/bin/medrt
            if words[1:]:  # the program's name alone is no command
                yield words[1:]
        elif program == "medrt" and PYTHON.fullmatch(head) and words[1:3] == ["-m", "medrt"]:
            yield words[3:]


def _script_invocations(tokens: list[str]) -> Iterator[tuple[str, list[str]]]:
    """``python -m medrt.models.X ...`` in one shell line's tokens: the module and its
    arguments (none is a command too: evaluate and ceiling run on their defaults). A model
    card's record of a resumed run shows the first run's command after a colon in a
    sentence (``...; continuing the weights of a first run ...: python -m ...``). In a
    synopsis, ``medrt.models.train|evaluate`` is each of them."""
    for words in _simple_commands(tokens):
        for i in range(len(words) - 2):
            if (i == 0 or words[i - 1].endswith(":")) and PYTHON.fullmatch(words[i]) \
                    and words[i + 1] == "-m" and words[i + 2].startswith("medrt.models."):
                for script in words[i + 2].removeprefix("medrt.models.").split("|"):  # train|ensemble
                    yield f"medrt.models.{script}", words[i + 3:]
                break


def _runs(tokens: list[str]) -> Iterator[tuple[str, list[str]]]:
    """What one shell line runs: (program, arguments) for medrt and the training scripts."""
    for words in _invocations(tokens, "medrt"):
        yield "medrt", words
    yield from _script_invocations(tokens)


ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", flags=re.S)


def _expanded(tokens: list[str], variables: dict[str, str]) -> list[str]:
    """A line of assignments only is remembered; in any other, a word that is a remembered
    ``$NAME`` or ``${NAME}`` is replaced by its value's words, as the shell splits them."""
    if tokens and all(ASSIGNMENT.match(tok) for tok in tokens):
        for tok in tokens:
            name, value = ASSIGNMENT.match(tok).groups()  # type: ignore[union-attr]
            variables[name] = value
        return tokens
    out: list[str] = []
    for tok in tokens:
        name = re.fullmatch(r"\$(?:\{(\w+)\}|(\w+))", tok)
        key = name and (name.group(1) or name.group(2))
        out.extend(variables[key].split() if key in variables else [tok])
    return out


def _split(text: str, synopsis: bool) -> list[str]:
    if synopsis:  # brackets and bars are no shell syntax here ("[--workers N | --processes N]")
        return re.sub(r"\s+\|\s+", "|", re.split(r"\s+#", text, maxsplit=1)[0]).split()
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in a prose span: as words
        return text.split()


def _fenced_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Logical lines of the shell-like fenced blocks: continuations joined, each with the
    number of its first line."""
    fence = None
    lang = ""
    pending: tuple[int, str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*(\S*)", line)
        if fence is None:
            if opening:
                fence, lang = opening.group(1), opening.group(2).lower()
            continue
        if opening and line.strip().startswith(fence) and not opening.group(2):
            if pending:
                yield pending
            fence, pending = None, None
            continue
        if lang not in SHELL_LANGS:
            continue
        text = re.split(r"\s{3,}(?!#)", line.strip(), maxsplit=1)[0]  # a usage table's description
        if text.startswith("$ "):
            text = text[2:]
        if pending and (pending[1].endswith("\\") or (line[:1].isspace() and text.startswith("["))):
            pending = (pending[0], pending[1].rstrip("\\").rstrip() + " " + text)
            continue
        if pending:
            yield pending
        pending = (number, text)
    if pending:
        yield pending


def _inline_spans(path: Path) -> Iterator[tuple[int, str]]:
    """Inline code spans outside fenced blocks (CommonMark: a run of n backticks closes at
    the next run of n; a span may wrap lines, but not a paragraph), with a table's ``\\|``
    read as ``|``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    prose: list[str] = []
    fence = None
    for line in lines:
        opening = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and opening:
            fence = opening.group(1)
            prose.append("")
        elif fence is not None:
            if opening and line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            prose.append("")
        else:
            prose.append(line)
    text = "\n".join(prose)
    for match in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, flags=re.S):
        span = match.group(2)
        if "\n\n" in span:
            continue
        number = text.count("\n", 0, match.start()) + 1
        yield number, re.sub(r"\s+", " ", span.replace("\\|", "|")).strip()


def markdown_commands(path: Path) -> list[Command]:
    commands = []
    variables: dict[str, str] = {}  # LITE="python -m medrt.models.train ...", for $LITE
    for number, text in _fenced_lines(path):
        synopsis = bool(SYNOPSIS_MARKS.search(text))
        for program, words in _runs(_expanded(_split(text, synopsis), variables)):
            commands.append(Command(f"{_relative(path)}:{number}", words, False, synopsis, program))
    for number, span in _inline_spans(path):
        if span in PLACEHOLDERS:
            continue
        synopsis = bool(SYNOPSIS_MARKS.search(span))
        for program, words in _runs(_split(span, synopsis)):
            if words and words[0].endswith(":"):  # "medrt batch: cannot write ...": a message
                continue
            commands.append(Command(f"{_relative(path)}:{number}", words, True, synopsis, program))
    return commands


def doc_commands() -> list[Command]:
    return [c for path in MARKDOWN for c in markdown_commands(path)] + installer_commands()


def installer_commands() -> list[Command]:
    """The listener's options as installed (listen.env's line and each example in its
    comments, after the unit's ExecStart) and the commands the installer's files show."""
    commands = []
    unit = INSTALLER / "medrt-listen.service"
    exec_start = []
    for number, line in enumerate(unit.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("ExecStart="):
            exec_start = [w for w in next(_invocations(line.split("=", 1)[1].split(), "medrt"))
                          if w != "$MEDRT_LISTEN_OPTIONS"]
            commands.append(Command(f"{_relative(unit)}:{number}", exec_start, False, False))
    assert exec_start, f"{_relative(unit)}: no ExecStart running medrt"
    env = INSTALLER / "listen.env"
    for number, line in enumerate(env.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("MEDRT_LISTEN_OPTIONS="):
            options = line.split("=", 1)[1].split()
        elif re.match(r"^#\s+--", line):  # an example: options, then a gap, then what they do
            options = re.split(r"\s{2,}|\s\.\.\.\s", line[1:].strip(), maxsplit=1)[0].split()
        else:
            continue
        commands.append(Command(f"{_relative(env)}:{number}", exec_start + options, False, False))
    script = INSTALLER / "install-listener.sh"
    for number, line in enumerate(script.read_text(encoding="utf-8").splitlines(), 1):
        for quoted in re.findall(r'"([^"]*)"', line):
            for part in quoted.split(";"):
                shown = re.search(r"\S*/bin/medrt .*", part)  # "queue: sudo -u medrt $PREFIX/venv/bin/medrt spool ..."
                if not shown:
                    continue  # a path or a user's comment, no command
                for words in _invocations(shown.group(0).split(), "medrt"):
                    commands.append(Command(f"{_relative(script)}:{number}", words, False, False))
    # The alerts' texts, read in an incident: "medrt spool SPOOL --state failed says why" (a
    # command in a sentence, read as an inline span is), and the listener's options they name.
    alerts = INSTALLER / "medrt-alerts.yml"
    for number, line in enumerate(alerts.read_text(encoding="utf-8").splitlines(), 1):
        in_prose = r"\bmedrt ([a-z]+(?: [A-Z]+)?(?: --[\w-]+(?: [\w.:-]+)?)+)"  # needs an option
        for match in re.finditer(in_prose, line):
            commands.append(Command(f"{_relative(alerts)}:{number}", match.group(1).split(), True, False))
        prose = re.sub(in_prose, "", line)
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", prose):
            commands.append(Command(f"{_relative(alerts)}:{number}", ["listen", f"[{option}]"], True, True))
    return commands


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@functools.cache
def script_parser(module: str) -> argparse.ArgumentParser:
    """A training script's own parser (``medrt.models.train`` -> its build_parser())."""
    return importlib.import_module(module).build_parser()


def _root(program: str) -> argparse.ArgumentParser:
    return PARSER if program == "medrt" else script_parser(program)


def _parsers(words: list[str], root: argparse.ArgumentParser, program: str = "medrt"
             ) -> tuple[list[argparse.ArgumentParser], str, list[str]]:
    """The parsers the command words lead to (several for ``ct|xray|sample``), the command's
    name (the program's, then its subcommands') and what is wrong with its words."""
    parsers = [root]
    names: list[str] = []
    problems = []
    for word in words:
        if word.startswith("-"):
            if len(names) == 0:
                continue  # an option of the top parser (-v)
            break
        subs = [_subcommands(p) for p in parsers]
        if not any(subs):
            break
        if word in {"...", "…"}:  # "medrt phantom ... --compress htj2k": any of its commands
            parsers = [c for s in subs for c in s.values()]
            names.append(word)
            continue
        alternatives = word.strip("[]").split("|")
        unknown = [a for a in alternatives if not any(a in s for s in subs)]
        if unknown:
            problems.append(f"no command {' '.join([_display(program), *names, *unknown])!r}")
            break
        parsers = [s[a] for s in subs for a in alternatives if a in s]
        names.append(word)
    return parsers, " ".join([_display(program), *names]), problems


def _option_problems(command: Command, parsers: list[argparse.ArgumentParser], name: str) -> list[str]:
    problems = []
    root = _root(command.program)
    words = command.words
    for i, word in enumerate(words):
        for option in re.findall(r"(?:^|[\[|(])(--?[A-Za-z][\w-]*)", word):
            if re.fullmatch(r"-([A-Za-z])\1+", option):  # -vv: -v twice
                option = option[:2]
            owners = [p for p in parsers if option in p._option_string_actions]
            if not owners and option not in root._option_string_actions:
                problems.append(f"{name} has no option {option}")
                continue
            if not command.synopsis or not owners or i + 1 >= len(words):
                continue
            action = owners[0]._option_string_actions[option]
            value = words[i + 1]
            if action.nargs == 0 or value.startswith(("-", "[")):
                continue
            if re.fullmatch(r"\[?(--[\w-]+)", word) and re.fullmatch(r"\d[\d.]*\]+", value):
                shown = value.rstrip("]")  # "[--idle 10]": the default
                try:
                    same = _converted(action, shown) == action.default
                except (TypeError, ValueError, argparse.ArgumentTypeError):
                    same = False
                if not same:
                    problems.append(f"{option} of {name}: the synopsis shows {shown}, "
                                    f"the default is {action.default}")
                continue
            if action.choices is None:
                continue
            wrong = [v for v in value.strip("[]").split("|") if not _a_choice(action, v)]
            if wrong:
                problems.append(f"{option} of {name} takes no {', '.join(wrong)} "
                                f"(choices: {', '.join(map(str, action.choices))})")
    return problems


def _a_choice(action: argparse.Action, value: str) -> bool:
    """Whether a synopsis's value is one of the option's choices; a placeholder (``...``,
    ``N``, a range ``1-4``) stands for any."""
    if value in {"...", "…"} or re.fullmatch(r"[A-Z][A-Z0-9_]*|\d+-\d+", value):
        return True
    try:
        return _converted(action, value) in action.choices  # type: ignore[operator]
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False


def _converted(action: argparse.Action, value: str) -> object:
    return action.type(value) if callable(action.type) else value


def _takes_number(parsers: list[argparse.ArgumentParser], option: str) -> bool:
    action = next((p._option_string_actions[option] for p in parsers if option in p._option_string_actions), None)
    if action is None or action.type is None or action.choices is not None:
        return False
    try:
        action.type("N")
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return True
    return False


def _parse_problem(command: Command, parsers: list[argparse.ArgumentParser]) -> str | None:
    words = list(command.words)
    if command.inline and words and words[-1].startswith("--"):
        action = next((p._option_string_actions[words[-1]] for p in parsers
                       if words[-1] in p._option_string_actions), None)
        if action is not None and action.nargs != 0:
            words.pop()  # "`medrt batch --ray`": the option named, its value left to the text
    for i, word in enumerate(words):
        if re.fullmatch(r"\$\(\(.*\)\)", word):  # the shell's arithmetic: a number
            words[i] = "1"
        elif i and re.fullmatch(r"[A-Z][A-Z0-9_]*", word) and _takes_number(parsers, words[i - 1]):
            words[i] = "1"  # "--frames N": a placeholder in capitals, for a number
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _root(command.program).parse_args(words)
    except SystemExit as exc:
        if exc.code == 0:  # --help, --version
            return None
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
        if command.inline and "the following arguments are required" in message:
            return None
        return message
    return None


def command_problems(command: Command) -> list[str]:
    if command.program != "medrt":
        script = command.program.removeprefix("medrt.models.")
        if script not in SCRIPTS:
            return [f"no script {command.program} (the recipe's: {', '.join(SCRIPTS)})"]
    elif not command.words:
        return ["no command after medrt"]
    parsers, name, problems = _parsers(command.words, _root(command.program), command.program)
    if problems:
        return problems
    problems = _option_problems(command, parsers, name)
    if not problems and not command.synopsis:
        parse = _parse_problem(command, parsers)
        if parse:
            problems.append(parse)
    return problems


PARSER = build_parser()


def _reported(commands: list[Command]) -> list[str]:
    """Each command's problems, but for a historical record's removed option (HISTORICAL)."""
    bad = []
    for c in commands:
        file = c.where.split(":")[0]
        for problem in command_problems(c):
            removed = re.search(r"has no option (\S+)$", problem)
            if removed and (file, removed.group(1)) in HISTORICAL:
                continue
            bad.append(f"{c.where}: {c.shown}\n    {problem}")
    return bad


def test_every_documented_command_parses() -> None:
    commands = [c for c in doc_commands() if c.program == "medrt"]
    # the extraction itself: it finds the usage table, a fenced example, the inline spans
    # and the installer's lines (a regression here would pass every line unread)
    assert len(commands) > 250, len(commands)
    assert sum(c.synopsis for c in commands) > 20 and sum(not c.inline for c in commands) > 40
    assert {c.where.split(":")[0] for c in commands} >= {
        "README.md", "docs/performance-log.md", "docs/conformance.md", "models/README.md",
        "sample_dicom/README.md", "installer/listen.env", "installer/medrt-listen.service",
        "installer/install-listener.sh", "installer/medrt-alerts.yml"}
    bad = _reported(commands)
    assert not bad, f"{len(bad)} documented command(s) the CLI does not take:\n" + "\n".join(bad)


def test_every_documented_training_command_parses() -> None:
    """The training recipe (README, the model cards, models/README.md, the models log) as
    each script's own parser takes it."""
    commands = [c for c in doc_commands() if c.program != "medrt"]
    # the extraction: each script read, fenced ($LITE expanded) and inline, from the recipe's files
    assert len(commands) > 50, len(commands)
    assert {c.program for c in commands} >= {f"medrt.models.{s}" for s in SCRIPTS}, commands
    assert sum(not c.inline for c in commands) >= 12 and sum(c.synopsis for c in commands) >= 2
    assert {c.where.split(":")[0] for c in commands} >= {
        "README.md", "docs/models-log.md", "docs/performance-log.md", "models/README.md",
        "models/lesion_unet.md", "models/lesion_unet_dx.md", "models/lesion_unet_lite.md",
        "models/roi_classifier.md", "models/roi_classifier_dx.md"}
    assert all(file == "docs/models-log.md" for file, _ in HISTORICAL), HISTORICAL
    bad = _reported(commands)
    assert not bad, f"{len(bad)} documented training command(s) the scripts do not take:\n" + "\n".join(bad)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {t for line in re.findall(r"^([^\s#=:][^=:]*):(?!=)", text, flags=re.M) for t in line.split()}


def doc_make_targets() -> list[tuple[str, str]]:
    found = []
    for path in MARKDOWN:
        for number, text in [*_fenced_lines(path), *_inline_spans(path)]:
            for words in _invocations(_split(text, False), "make"):
                for word in words:
                    if not word.startswith("-") and "=" not in word:
                        found.append((f"{_relative(path)}:{number}", word))
    return found


def test_documented_make_targets_exist() -> None:
    targets = _make_targets()
    assert {"demo", "test"} <= targets, targets
    found = doc_make_targets()
    bad = [f"{where}: make {target}" for where, target in found if target not in targets]
    assert not bad, "make target(s) the Makefile lacks:\n" + "\n".join(bad)
    assert {t for _, t in found} >= {"demo", "test"}, found  # the quick start's, read


@pytest.mark.parametrize(("words", "inline", "expected"), [
    (["spool", "DIR", "extra"], False, "unrecognized arguments"),
    (["phantom", "ct", "--out", "x", "--seed", "many"], False, "--seed"),
    (["batch", "in", "--out", "out", "--no-such-option"], False, "has no option --no-such-option"),
    (["listen", "--spool", "s", "--keep-result", "3"], False, "has no option --keep-result"),  # argparse takes it
    (["batch", "--png", "some"], True, "invalid choice"),
    (["phantom", "ct|xray|film"], True, "no command 'medrt phantom film'"),
    (["batch", "[--png", "positive|every]"], True, "takes no every"),
    (["batch", "in"], False, "the following arguments are required"),
    (["listen", "--spool", "DIR", "[--idle", "11]"], False, "the synopsis shows 11, the default is 10"),
])
def test_a_stale_command_is_reported(words: list[str], inline: bool, expected: str) -> None:
    """The checks can fail: each kind of stale line gives its reason."""
    command = Command("x.md:1", words, inline, bool(SYNOPSIS_MARKS.search(" ".join(words))))
    assert any(expected in p for p in command_problems(command)), command_problems(command)


def test_fenced_lines_and_spans_are_read_as_documented(tmp_path: Path) -> None:
    """The extraction's rules (module docstring) on a small document."""
    doc = tmp_path / "doc.md"
    doc.write_text("Run `medrt batch IN --out OUT -v` or `.venv/bin/medrt eval a b`.\n\n"
                   "```sh\n$ CI=true medrt stream DIR \\\n    --fps 30   # comment\n"
                   "for s in 1 2; do medrt phantom ct --out x$s; done\n"
                   "medrt info PATH... [--json]   what it does\n             [--route]\n"
                   "make demo    # the demo\n```\n", encoding="utf-8")
    assert list(_fenced_lines(doc))[0] == (4, "CI=true medrt stream DIR --fps 30   # comment")
    assert [w for _, t in _fenced_lines(doc) for w in _invocations(_split(t, False), "medrt")] == [
        ["stream", "DIR", "--fps", "30"], ["phantom", "ct", "--out", "x$s"],
        ["info", "PATH...", "[--json]", "[--route]"]]
    assert [w for _, t in _fenced_lines(doc) for w in _invocations(_split(t, False), "make")] == [["demo"]]
    assert [w for _, t in _inline_spans(doc) for w in _invocations(_split(t, False), "medrt")] == [
        ["batch", "IN", "--out", "OUT", "-v"], ["eval", "a", "b"]]


@pytest.mark.parametrize(("program", "words", "inline", "expected"), [
    ("medrt.models.train", ["lesion_unet", "--lesion-star", "0.5"], False, "has no option --lesion-star"),
    ("medrt.models.train", ["lesion_unet_xl", "--steps", "1"], False, "invalid choice: 'lesion_unet_xl'"),
    ("medrt.models.train", ["lesion_unet", "--data", "mr"], False, "invalid choice: 'mr'"),
    ("medrt.models.ensemble", ["lesion_unet_lite", "m0", "m1"], False, "required: --version"),
    ("medrt.models.evaluate", ["[--n-dx", "40]"], False, "the synopsis shows 40, the default is 160"),
    ("medrt.models.thin", ["--seed", "many"], False, "--seed: invalid int value"),
    ("medrt.models.ceiling", ["--json", "extra"], False, "unrecognized arguments: extra"),
    ("medrt.models.ceiling", ["--specificity"], True, ""),  # an inline mention of the option: none
    ("medrt.models.nosuch", [], True, "no script medrt.models.nosuch"),
    ("medrt.models.thin", ["[--series", "N]", "[--fp", "P]"], True, "has no option --fp"),  # ceiling's
])
def test_a_stale_training_command_is_reported(program: str, words: list[str], inline: bool, expected: str) -> None:
    """The training scripts' lines are checked as medrt's are, each by its own parser."""
    command = Command("x.md:1", words, inline, bool(SYNOPSIS_MARKS.search(" ".join(words))), program)
    problems = command_problems(command)
    assert any(expected in p for p in problems) if expected else not problems, problems


def test_a_removed_option_is_allowed_in_the_models_log_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """HISTORICAL lets a models-log record keep an option removed since, and nothing more."""
    monkeypatch.setitem(HISTORICAL, ("docs/models-log.md", "--gone"), "removed in abc1234 (test)")
    record = ["lesion_unet", "--gone", "1", "--steps", "2"]
    assert not _reported([Command("docs/models-log.md:7", record, True, False, "medrt.models.train")])
    assert _reported([Command("models/lesion_unet.md:7", record, True, False, "medrt.models.train")])
    also_wrong = ["lesion_unet", "--gone", "1", "--stepz", "2"]
    assert _reported([Command("docs/models-log.md:7", also_wrong, True, False, "medrt.models.train")])


def test_training_lines_are_read_as_documented(tmp_path: Path) -> None:
    """``python -m medrt.models.X`` lines: fenced, with a remembered variable expanded, a
    script with no arguments, and inline, with a card's resumed run after its colon."""
    doc = tmp_path / "doc.md"
    doc.write_text("Run `python -m medrt.models.evaluate` or `python -m medrt.models.train roi_classifier"
                   " --steps 1; continuing the weights of a first run (1 s): python -m medrt.models.train"
                   " roi_classifier --steps 2` (CPU).\n\n"
                   "```sh\nLITE=\"python -m medrt.models.train lesion_unet_lite \\\n    --steps 3\"\n"
                   "OMP_NUM_THREADS=1 $LITE --out m0 & .venv/bin/python -m medrt.models.ensemble x m0 m1 --version 1\n"
                   "python3 -m medrt.models.evaluate       # the defaults\n"
                   "python -m medrt batch IN --out OUT\n```\n\n"
                   "Each of `python -m medrt.models.thin|ceiling [--seed N]`.\n", encoding="utf-8")
    assert [(c.where, c.program, c.words, c.inline) for c in markdown_commands(doc)] == [
        ("doc.md:6", "medrt.models.train", ["lesion_unet_lite", "--steps", "3", "--out", "m0"], False),
        ("doc.md:6", "medrt.models.ensemble", ["x", "m0", "m1", "--version", "1"], False),
        ("doc.md:7", "medrt.models.evaluate", [], False),
        ("doc.md:8", "medrt", ["batch", "IN", "--out", "OUT"], False),
        ("doc.md:1", "medrt.models.evaluate", [], True),
        ("doc.md:1", "medrt.models.train", ["roi_classifier", "--steps", "1"], True),
        ("doc.md:1", "medrt.models.train", ["roi_classifier", "--steps", "2"], True),
        ("doc.md:11", "medrt.models.thin", ["[--seed", "N]"], True),
        ("doc.md:11", "medrt.models.ceiling", ["[--seed", "N]"], True)]
