"""Issue #33 red team: ``rollback -d ssh://`` to a device that answers gigabytes is one line, exit 2.

The device here is a real sshd whose key is bound to a forced command that prints 100 MB (the red team's answered
3 GB: the store read it all to a temporary file, then into memory, MemoryError, exit 3). The store now reads each
answer with a bound and stops the connection past it.
"""

from __future__ import annotations

import re
from pathlib import Path

from edge.store.ssh import MAX_ANSWER_BYTES
from tests.support.cli import assert_user_error, run_cli
from tests.support.sshd_server import Sshd, needs_sshd, sshd  # noqa: F401  (sshd: the fixture)

pytestmark = needs_sshd


def test_a_device_that_answers_too_much_is_cut_off(sshd: Sshd, tmp_path: Path) -> None:  # noqa: F811
    keys = Path(re.search(r"IdentityFile=(\S+)", sshd.options).group(1)).parent / "authorized_keys"  # type: ignore[union-attr]
    size = MAX_ANSWER_BYTES * 6
    keys.write_text(f'command="head -c {size} /dev/zero" ' + keys.read_text())
    p = run_cli("rollback", "-d", sshd.url(tmp_path / "store"), env={"EDGEKIT_SSH_OPTIONS": sshd.options})
    assert_user_error(p, "answered more than 16 MiB", "cut off")
