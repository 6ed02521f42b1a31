"""The one-way layer contract (gateway <- knowledge <- tools <- graphs <- eval <- serving)
and the AGPL isolation rule, checked by import-linter on the real import graph."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from tests.conftest import REPO



def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken" in result.stdout, result.stdout
