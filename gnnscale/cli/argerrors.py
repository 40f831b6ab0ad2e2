"""jsonargparse's reports of a refused key or value, condensed to one line a user can act on.

jsonargparse tries each type of a union and reports every attempt; ``gnnscale.cli`` raises
:func:`one_line`'s summary as a ``ConfigError`` (printed as ``gnnscale: error: ...``, exit 2).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import pydoc
import re

__all__ = ["one_line"]

_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Expected a <class 'NoneType'>",
    "Given value type:",
)


def one_line(message: str, command: str = "gnnscale fit") -> str:
    """Condense jsonargparse's report of a refused key or value (union attempts) to one line."""
    keys, reasons, given, class_path = [], [], "", ""
    for line in message.splitlines():
        line = line.strip().removeprefix("- ")
        if match := re.match(r'Parser key "(.+?)":\s*(.*)$', line):
            keys.append(match[1])
            line = match[2]
        if not line:
            continue
        if match := re.match(r"Problem with given class_path '(.+)':$", line):
            class_path = match[1]
        elif line.startswith("Given value:"):
            given = line.removeprefix("Given value:").strip()
        elif match := re.match(
            r"Expected a typing\.Literal\[(.*?)\](?:\. Got value: (.*))?$", line
        ):
            choices = ", ".join(c.strip().strip("'\"") for c in match[1].split(","))
            reasons.append(f"must be one of {choices}" + (f" (got {match[2]})" if match[2] else ""))
        elif not line.startswith(_NOISE):
            reasons.append(re.sub(r"<class '([\w.]+)'>", r"\1", line))
    if not keys:  # not about a key: "unrecognized arguments: ...", a missing config file, ...
        return f"{' '.join(reasons)} (see `{command} --help`)"
    key = "--" + ".".join(keys)
    match = re.match(r"NestedArg\(key='((.+)\.(\w+))', val=None\)$", given)
    if match and re.search(rf'Parser key "{match[1]}":\s*\n.*\n\s*Subtypes: .*NoneType', message):
        # jsonargparse 4.53 reads `null` for a key nested in a class's group only from a mapping
        flag, field = f"--{keys[0]}.init_args.{match[2]}", match[3]
        return (
            f"{key}: null is not read for a nested key on the command line; write "
            f"{flag}='{{{field}: null}}' (the group's other settings are kept) or set it in the "
            "config file"
        )
    if match:
        given = "null"
    refused = r"Option '(\w+)' is not accepted|unrecognized arguments: --([\w.]+)"
    if len(reasons) == 1 and (match := re.match(refused, reasons[0])) and class_path:
        option = match[1] or match[2]  # the second: a key of one of the class's groups
        options = _options(class_path)
        # A group's field of exactly that name (``sampler``: ``loader.sampler``) before any
        # name that is merely close (``sampling``).
        exact = [o for o in options if o.rsplit(".", 1)[-1] == option]
        close = exact[:1] or difflib.get_close_matches(option, options, n=1)
        hint = (
            f"did you mean {key}.{close[0]}?"
            if close
            else f"see `{command} {key}.help {class_path}`"
        )
        return f"{key}.{option} is not an option of {class_path}; {hint}"
    if given and not any("Got value" in r for r in reasons):
        reasons.append(f"got {given!r}")
    return f"{key}: {'; '.join(reasons)}"


def _options(class_path: str) -> list[str]:
    """The keys ``class_path`` takes: its parameters, and ``group.field`` for a dataclass group."""
    cls = pydoc.locate(class_path)
    if not callable(cls):
        return []
    try:
        parameters = inspect.signature(cls, eval_str=True).parameters.values()
    except (NameError, TypeError):  # an annotation that does not resolve here
        return list(inspect.signature(cls).parameters)
    names = []
    for parameter in parameters:
        names.append(parameter.name)
        if dataclasses.is_dataclass(group := parameter.annotation):
            names += [f"{parameter.name}.{f.name}" for f in dataclasses.fields(group)]
    return names
