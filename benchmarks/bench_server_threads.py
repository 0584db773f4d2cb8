"""The embedded llama.cpp server: which server, its thread count and OpenMP wait policy,
idle and under load.

    .venv/bin/python benchmarks/bench_server_threads.py [--servers llama-server,llama-cpp-python]
        [--threads 2,1] [--policies ACTIVE,PASSIVE] [--loads idle,busy] [--prompts 1000,3000]
        [--repeats 1]

For each load x server x threads x policy it starts the plugin's own
:class:`EmbeddedServer` (the GGUF the plugin serves, its pinned flags; ``llama-server`` is
llama.cpp's own, which .ci/install builds, ``llama-cpp-python`` the library's server;
``--policies unset`` leaves OMP_WAIT_POLICY out of the environment, as before the wait
policy was pinned; ``library`` is no server but the library in this process, the rate the
build itself gives) and measures:

- prompt tok/s on prompts of about 1K and 3K tokens (each starts with a fresh nonce, so no
  KV cache is reused; one answer token), and the server's CPU seconds for each;
- decode tok/s: 32 answer tokens after a short prompt;
- idle CPU: the server's CPU seconds in the 3 s after its last request (spinning threads).

``busy`` runs one ``while True: pass`` process beside the server (on 2 cores: a test or an
xdist worker that computes), killed when the row is measured. The goal: the pinned default
(threads, policy) is the best or near it under load and costs nothing when idle; the table
shows the load average at start and at each row's start, as every number here depends on
what else runs (the busy loop itself adds about 1 to the rows after it).
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_budgetbench.embedded_server.models import embedded_model
from pytest_budgetbench.embedded_server.process import EmbeddedServer

BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
SENTENCE = "Sentence {n}: the river runs past the old mill and the miller counts his sacks. "
TOKENS_PER_SENTENCE = 20  # about, on SmolLM2's and Qwen's tokenizers; rows show the real count
IDLE_WINDOW_S = 3.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Measure:
    tokens: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else float("nan")


def request(server: EmbeddedServer, content: str, max_tokens: int) -> Measure:
    import httpx

    pid = server.pid
    assert pid is not None
    cpu, started = cpu_seconds(pid), time.perf_counter()
    reply = httpx.post(server.base_url + "/chat/completions", timeout=900.0, json={
        "model": embedded_model().alias, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0.0, "seed": 0})
    wall = time.perf_counter() - started
    reply.raise_for_status()
    usage = reply.json()["usage"]
    tokens = usage["prompt_tokens"] if max_tokens == 1 else usage["completion_tokens"]
    return Measure(int(tokens), wall, cpu_seconds(pid) - cpu)


def prompt_of(tokens: int) -> str:
    sentences = "".join(SENTENCE.format(n=n) for n in range(tokens // TOKENS_PER_SENTENCE))
    return f"{secrets.token_hex(8)}\n{sentences}\nWhich sentence mentions sacks first?"


LIBRARY = "library"
"""Not a server: llama-cpp-python's ``Llama`` in this process with the server's flags, the
prompt evaluated with no server in between (its OpenMP policy is this process's): the rate
this build of llama.cpp itself gives, the most a server of it can reach."""


def measure_library(threads: int, prompts: list[int]) -> dict[str, Measure]:
    from llama_cpp import Llama

    from pytest_budgetbench.embedded_server.models import gguf_path

    llama = Llama(model_path=str(gguf_path(embedded_model())), n_ctx=8192, n_threads=threads,
                  n_threads_batch=threads, n_batch=512, logits_all=False, flash_attn=False,
                  seed=0, verbose=False)

    def evaluate(text: str) -> Measure:
        tokens = llama.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llama.reset()  # no KV cache reused: the whole prompt is evaluated
        cpu, started = time.process_time(), time.perf_counter()
        llama.eval(tokens)
        return Measure(len(tokens), time.perf_counter() - started, time.process_time() - cpu)

    evaluate("Hello")  # warm, as for the servers
    row = {f"prompt {size}": evaluate(prompt_of(size)) for size in prompts}
    row["decode"] = row["idle"] = Measure(0, 0.0, float("nan"))  # not measured here
    return row


def measure_row(server_kind: str, threads: int, policy: str, busy: bool, prompts: list[int],
                log_dir: Path) -> dict[str, Measure]:
    loop = None
    if busy:
        loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=1800)])
    if server_kind == LIBRARY:
        try:
            return measure_library(threads, prompts)
        finally:
            if loop is not None:
                loop.kill()
                loop.wait()
    server = EmbeddedServer(n_ctx=8192, threads=threads, log_path=log_dir / "server.log",
                            wait_policy=None if policy == "unset" else policy,
                            prefer_llama_server=server_kind == "llama-server")
    if server.server != server_kind:
        raise SystemExit(f"{server_kind} is not installed (bash .ci/install builds it)")
    try:
        server.start()
        request(server, "Hello", 1)  # warm: the first request pays for buffers
        row = {f"prompt {size}": request(server, prompt_of(size), 1) for size in prompts}
        row["decode"] = request(server, f"{secrets.token_hex(8)} Count from 1 to 100.", 32)
        pid = server.pid
        assert pid is not None
        idle_cpu = cpu_seconds(pid)
        time.sleep(IDLE_WINDOW_S)
        row["idle"] = Measure(0, IDLE_WINDOW_S, cpu_seconds(pid) - idle_cpu)
        return row
    finally:
        server.stop()
        if loop is not None:
            loop.kill()
            loop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="llama-server,llama-cpp-python")
    parser.add_argument("--threads", default="2,1")
    parser.add_argument("--policies", default="ACTIVE,PASSIVE",
                        help="OMP_WAIT_POLICY values; 'unset' leaves it out")
    parser.add_argument("--loads", default="idle,busy")
    parser.add_argument("--prompts", default="1000,3000", help="prompt sizes, about, tokens")
    parser.add_argument("--repeats", type=int, default=1, help="rows per configuration")
    args = parser.parse_args()
    prompts = [int(size) for size in args.prompts.split(",")]
    load1, load5, _ = os.getloadavg()
    print(f"cores {os.cpu_count()}, load average at start {load1:.2f} (1 min), "
          f"{load5:.2f} (5 min); model {embedded_model().alias}")
    header = f"{'load':<6}{'server':>17}{'threads':>8}{'policy':>9}"
    for size in prompts:
        header += f"{f'~{size} tok/s':>12}{'cpu s':>7}"
    print(header + f"{'decode tok/s':>14}{'cpu s':>7}{'idle cpu s/3s':>15}{'load1':>7}")
    with tempfile.TemporaryDirectory() as log_dir:
        for load in args.loads.split(","):
            for _ in range(args.repeats):  # alternating servers: drifts hit both
                for kind, threads, policy in itertools.product(
                        args.servers.split(","), map(int, args.threads.split(",")),
                        args.policies.split(",")):
                    load_now = os.getloadavg()[0]  # others' work moves it; it is per row
                    row = measure_row(kind, threads, policy, load == "busy", prompts,
                                      Path(log_dir))
                    line = f"{load:<6}{kind:>17}{threads:>8}{policy:>9}"
                    for size in prompts:
                        m = row[f"prompt {size}"]
                        line += f"{m.per_s:>12.1f}{m.cpu_s:>7.1f}"
                    decode = row["decode"]
                    print(line + f"{decode.per_s:>14.1f}{decode.cpu_s:>7.1f}"
                          f"{row['idle'].cpu_s:>15.2f}{load_now:>7.2f}", flush=True)

if __name__ == "__main__":
    main()
