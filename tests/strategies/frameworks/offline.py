"""Run code in a fresh process where every connection is refused: a framework's import, its
counter or its policy must fetch nothing (no tiktoken encoding, no hub, no cost map)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REFUSE_NETWORK = (
    "import socket, sys\n"
    "def refuse(*args, **kwargs):\n"
    "    print('NETWORK', args[1:] or kwargs, file=sys.stderr); raise OSError('no net')\n"
    "socket.socket.connect = refuse\n"
    "socket.getaddrinfo = refuse\n"
)


def run_offline(code: str, tiktoken_cache: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run after REFUSE_NETWORK, with tiktoken's cache pointed at an empty
    ``tiktoken_cache``; asserts it exited 0 and tried no connection."""
    done = subprocess.run([sys.executable, "-c", REFUSE_NETWORK + code], capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, "TIKTOKEN_CACHE_DIR": str(tiktoken_cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NETWORK" not in done.stderr, done.stderr[-2000:]
    return done
