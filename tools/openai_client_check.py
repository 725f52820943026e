#!/usr/bin/env python3
"""The official `openai` Python client against our server: a client nobody here wrote.

    pip install openai
    cargo build --release --workspace --all-features --examples
    python3 tools/openai_client_check.py            # starts target/release/examples/serve itself
    python3 tools/openai_client_check.py --url http://127.0.0.1:8000/v1 --model NAME

Checks: models.list; a chat completion, non-streamed and streamed (the stream concatenates to the
same text, greedy), with the reasoning switch through `extra_body={"chat_template_kwargs": …}`;
a text completion; log-probabilities (completions `logprobs=5, echo=True, max_tokens=0`, echo
with generation, chat `logprobs=True, top_logprobs=5`: the client's values equal the server's JSON
for the same request, tops sorted and at most 5); a refused parameter raising the client's
BadRequestError (400) with our message. Exits non-zero on the first failure. CI does not run it (no Python there).
"""
import argparse
import json
import sys
import urllib.request

import openai

import local_serve


def raw(url, path, body):
    """The same request as plain JSON over HTTP (what the server sent, before the client)."""
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def close(a, b, what):
    assert a is None and b is None or abs(a - b) <= 1e-6 * max(1.0, abs(b)), (what, a, b)


def check_top(top, n, own, what):
    """A `top_logprobs` list: at most n, most likely first, the token's own value among them
    where it ranks."""
    vals = [v for _, v in top]
    assert 0 < len(top) <= n and vals == sorted(vals, reverse=True), (what, top)
    assert own <= 0 and (own < vals[-1] or any(abs(own - v) < 1e-6 for v in vals)), (what, own, top)


def check_logprobs(c, model, url):
    """Log-probabilities through the client, as lm-evaluation-harness and clients ask them: the
    values the client parses equal the server's JSON for the same request (the server's own tests
    hold that JSON equal to the library's), and each entry is well formed."""
    prompt = "The sky is blue and"
    # Scoring: echo with max_tokens 0.
    body = dict(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=5)
    r = c.completions.create(**body)
    lp = r.choices[0].logprobs
    want = raw(url, "/completions", body)["choices"][0]["logprobs"]
    assert r.choices[0].text.endswith(prompt) and r.usage.completion_tokens == 0, r
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
    assert lp.tokens == want["tokens"] and lp.text_offset == want["text_offset"], lp
    for i in range(1, len(lp.tokens)):
        close(lp.token_logprobs[i], want["token_logprobs"][i], f"prompt token {i}")
        top = sorted(lp.top_logprobs[i].items(), key=lambda kv: -kv[1])
        check_top(top, 5, lp.token_logprobs[i], f"prompt token {i}")
    print(f"echo, max_tokens 0: {len(lp.tokens)} prompt tokens scored, e.g. {lp.token_logprobs[1]:.4f}")
    # Echo and generate: the prompt's entries, then the plain answer's.
    gen = dict(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=5,
               extra_body={"ignore_eos": True})
    plain = c.completions.create(**gen).choices[0].logprobs
    both = c.completions.create(echo=True, **gen).choices[0].logprobs
    k = len(lp.tokens)
    assert both.tokens == lp.tokens + plain.tokens, (both.tokens, lp.tokens, plain.tokens)
    for i, (a, b) in enumerate(zip(both.token_logprobs, lp.token_logprobs + plain.token_logprobs)):
        close(a, b, f"echo + generate, token {i}")
    assert len(both.tokens) == k + 4
    # Chat: logprobs=True, top_logprobs=5.
    cb = dict(model=model, messages=[{"role": "user", "content": "Name a prime."}], max_tokens=6,
              temperature=0, logprobs=True, top_logprobs=5)
    r = c.chat.completions.create(extra_body={"ignore_eos": True}, **cb)
    content = r.choices[0].logprobs.content
    cb["ignore_eos"] = True
    want = raw(url, "/chat/completions", cb)["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 == len(want), (content, want)
    for j, (e, w) in enumerate(zip(content, want)):
        assert e.token == w["token"] and e.bytes == w["bytes"], (e, w)
        close(e.logprob, w["logprob"], f"chat token {j}")
        check_top([(t.token, t.logprob) for t in e.top_logprobs], 5, e.logprob, f"chat token {j}")
    print(f"chat logprobs: {len(content)} tokens, top 5 each, e.g. {content[0].token!r} {content[0].logprob:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running server's base URL (…/v1)")
    ap.add_argument("--model", default="nemotron-tiny-synthetic")
    ap.add_argument("--serve", default="target/release/examples/serve")
    a = ap.parse_args()

    proc, url = None, a.url
    if url is None:
        proc, url, _ = local_serve.start(a.serve)
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

        check_logprobs(c, a.model, url)

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
        local_serve.stop(proc)

if __name__ == "__main__":
    main()
