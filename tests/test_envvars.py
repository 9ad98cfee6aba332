"""``edge/envvars.py`` lists every ``EDGEKIT_*`` variable the code reads, and nothing else (issue #33 item 5): the
reference page generated from it cannot leave one out."""

from __future__ import annotations

import re

from edge.envvars import BY_NAME, ENVIRONMENT, markdown
from tests.support.cli import REPO

NAME = re.compile(r"EDGEKIT_[A-Z0-9_]*[A-Z0-9]")


def _named_in_code() -> dict[str, str]:
    found: dict[str, str] = {}
    for f in sorted((REPO / "edge").rglob("*.py")):
        if f.name == "envvars.py":
            continue
        for name in NAME.findall(f.read_text(encoding="utf-8")):
            found.setdefault(name, str(f.relative_to(REPO)))
    return found


def test_every_variable_the_code_names_is_listed() -> None:
    missing = {n: where for n, where in _named_in_code().items() if n not in BY_NAME}
    assert not missing, f"add these to edge/envvars.py: {missing}"


def test_every_listed_variable_is_read_where_it_says() -> None:
    in_code = _named_in_code()
    stale = [v.name for v in ENVIRONMENT if v.name not in in_code]
    assert not stale, f"edge/envvars.py lists variables no code names: {stale}"
    assert len(BY_NAME) == len(ENVIRONMENT), "a variable listed twice"
    for v in ENVIRONMENT:
        module = REPO / (v.read_by.replace(".", "/") + ".py")
        if not module.exists():
            module = REPO / v.read_by.replace(".", "/") / "__init__.py"
        assert module.exists(), (v.name, v.read_by)
        text = module.read_text(encoding="utf-8")
        # named there directly, or through the module's constant that holds the name
        assert v.name in text, (v.name, v.read_by)


def test_the_reference_page_lists_them_all() -> None:
    page = markdown()
    for v in ENVIRONMENT:
        assert f"| `{v.name}` |" in page
