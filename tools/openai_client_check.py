#!/usr/bin/env python3
"""The official `openai` Python client against our server: a client nobody here wrote.

    pip install openai
    cargo build --release --examples
    python3 tools/openai_client_check.py            # starts target/release/examples/serve itself
    python3 tools/openai_client_check.py --url http://127.0.0.1:8000/v1 --model NAME

Checks: models.list; a chat completion, non-streamed and streamed (the stream concatenates to the
same text, greedy), with the reasoning switch through `extra_body={"chat_template_kwargs": …}`;
a text completion; a refused parameter raising the client's BadRequestError (400) with our
message. Exits non-zero on the first failure. CI does not run it (no Python there).
"""
import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request

import openai


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running server's base URL (…/v1)")
    ap.add_argument("--model", default="nemotron-tiny-synthetic")
    ap.add_argument("--serve", default="target/release/examples/serve")
    a = ap.parse_args()

    proc = None
    url = a.url
    if url is None:
        port = free_port()
        proc = subprocess.Popen([a.serve, "--port", str(port)], stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                if proc.poll() is not None:
                    sys.exit(f"serve exited: {proc.stderr.read()}")
                time.sleep(0.1)
    try:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        ids = [m.id for m in c.models.list().data]
        assert a.model in ids, ids
        print("models:", ids)

        msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a prime."}]
        for thinking in (False, True):
            kw = dict(model=a.model, messages=msgs, max_tokens=16, temperature=0,
                      extra_body={"chat_template_kwargs": {"enable_thinking": thinking}, "ignore_eos": True})
            r = c.chat.completions.create(**kw)
            text = r.choices[0].message.content
            assert r.choices[0].finish_reason == "length", r
            assert r.usage.completion_tokens == 16, r.usage
            parts, usage = [], None
            for ch in c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
                if ch.usage is not None:
                    usage = ch.usage
                for choice in ch.choices:
                    parts.append(choice.delta.content or "")
            assert "".join(parts) == text, ("stream != non-stream", "".join(parts), text)
            assert usage is not None and usage.completion_tokens == 16, usage
            print(f"chat (thinking {thinking}): {text!r}  usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}")

        r = c.completions.create(model=a.model, prompt="The sky is", max_tokens=8, temperature=0)
        assert r.object == "text_completion" and r.usage.completion_tokens <= 8, r
        print(f"completion: {r.choices[0].text!r} ({r.choices[0].finish_reason})")

        try:
            c.chat.completions.create(model=a.model, messages=msgs, temperature=-1)
            sys.exit("temperature -1 was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and "temperature" in str(e), e
            print("refused as expected:", e.body)
        try:
            c.chat.completions.create(model="no-such-model", messages=msgs)
            sys.exit("an unknown model was accepted")
        except openai.BadRequestError as e:
            assert "no-such-model" in str(e), e
        print(f"openai {openai.__version__}: all checks passed")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
