"""Starts `examples/serve` on a free port for the client checks (`openai_client_check.py`,
`lm_eval_check.py`): the embedded tiny model unless the serve arguments say otherwise."""
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(serve):
    """`(proc, base_url, first_line)`: the server once `/health` answers; its first stderr line
    (for the tiny model: where its checkpoint and tokenizer were written). The rest of stderr is
    drained in the background, and shown if the server exits before it answers."""
    port = free_port()
    proc = subprocess.Popen([serve, "--port", str(port)], stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    rest = []
    threading.Thread(target=lambda: rest.extend(proc.stderr), daemon=True).start()
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, f"http://127.0.0.1:{port}/v1", first
        except Exception:
            if proc.poll() is not None:
                time.sleep(0.2)
                sys.exit(f"serve exited: {first}{''.join(rest)}")
            time.sleep(0.1)
    proc.terminate()
    sys.exit("serve did not answer /health within 60 s")


def stop(proc):
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
