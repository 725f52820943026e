//! The `loadtest` example's mixed load (issue 26): one long prompt sent into running streams, the
//! streams' inter-token gaps split into before / during / after its admission.

use crate::common::{example, run_example};
use serde_json::Value;

#[test]
fn loadtest_splits_the_streams_gaps_around_a_long_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("mixed.json");
    let (clients, requests, max_tokens) = (2usize, 3usize, 24usize);
    let o = std::process::Command::new(example("loadtest"))
        .args(["--clients", &clients.to_string()])
        .args(["--requests", &requests.to_string()])
        .args(["--max-tokens", &max_tokens.to_string()])
        .args([
            "--prompt-len",
            "16",
            "--long-prompt",
            "200",
            "--long-max-tokens",
            "4",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("Mixed load: one 200-token prompt"), "{out}");
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let m = &rows[0]["mixed"];
    assert!(m["long_error"].is_null(), "{m}");
    assert!(m["long_ttft_ms"].as_f64().unwrap() > 0.0, "{m}");
    let gaps = |ph: &str| m["phases"][ph]["gaps"].as_u64().unwrap() as usize;
    // Every stream gap lands in exactly one phase: each request streams max_tokens tokens, so
    // max_tokens - 1 gaps.
    assert_eq!(
        gaps("before") + gaps("during") + gaps("after"),
        clients * requests * (max_tokens - 1),
        "{m}"
    );
    // The long request is sent once 8 tokens per client have streamed, and the streams run on
    // through its admission and past it (3 requests of 24 tokens each).
    assert!(gaps("before") >= 1, "{m}");
    assert!(gaps("during") >= 1, "{m}");
    assert!(gaps("after") >= 1, "{m}");
}

#[test]
fn loadtest_refuses_long_options_without_a_long_prompt() {
    let o = std::process::Command::new(example("loadtest"))
        .args(["--clients", "1", "--requests", "1", "--long-after", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--long-prompt"),
        "{err}"
    );
}

/// `--mamba-ssm-cache-dtype bfloat16` reaches the in-process server (its start line says what
/// it built, after `with_ssm_cache` took it); with `--url`, or misspelled, it is refused by name.
#[test]
fn loadtest_takes_the_ssm_cache_dtype() {
    let run = |args: &[&str]| {
        let base = ["--clients", "2", "--requests", "1", "--max-tokens", "3"];
        run_example("loadtest", &[&base[..], args].concat())
    };
    let (ok, out) = run(&["--mamba-ssm-cache-dtype", "bfloat16"]);
    assert!(ok && out.contains("SSM state bfloat16"), "{out}");
    let (ok, out) = run(&[]);
    assert!(ok && out.contains("SSM state float32"), "{out}");
    let (ok, out) = run(&["--mamba-ssm-cache-dtype", "fp16"]);
    assert!(
        !ok && out.contains("--mamba-ssm-cache-dtype") && out.contains("fp16"),
        "{out}"
    );
    let (ok, out) = run(&[
        "--url",
        "http://127.0.0.1:9",
        "--mamba-ssm-cache-dtype",
        "bfloat16",
    ]);
    assert!(!ok && out.contains("not with --url"), "{out}");
}

/// `--shared-expert` reaches the in-process server's model (the line it prints counts the MoE
/// layers the model was built to fold, from the model): every layer under `fold`, under `auto`
/// and by default (auto; the tiny model's experts are quantized), none apart; misspelled or with
/// `--url`, refused.
#[test]
fn loadtest_takes_the_shared_expert() {
    let run = |args: &[&str]| {
        let base = ["--clients", "1", "--requests", "1", "--max-tokens", "2"];
        run_example("loadtest", &[&base[..], args].concat())
    };
    let layers = |out: &str, mode: &str| -> (usize, usize) {
        let tail = out
            .split(&format!("shared expert {mode}: "))
            .nth(1)
            .unwrap_or_else(|| panic!("no shared-expert line for {mode}: {out}"));
        let w: Vec<&str> = tail.split_whitespace().collect();
        (w[0].parse().unwrap(), w[2].parse().unwrap())
    };
    let (ok, out) = run(&["--shared-expert", "fold"]);
    let (f, n) = layers(&out, "fold");
    assert!(ok && n > 0 && f == n, "{out}");
    let (ok, out) = run(&["--shared-expert", "apart"]);
    assert!(ok && layers(&out, "apart") == (0, n), "{out}");
    let (ok, out) = run(&[]);
    assert!(ok && layers(&out, "auto") == (n, n), "the default: {out}");
    let (ok, out) = run(&["--shared-expert", "auto"]);
    assert!(ok && layers(&out, "auto") == (n, n), "{out}");
    let (ok, out) = run(&["--shared-expert", "sideways"]);
    assert!(!ok && out.contains("--shared-expert"), "{out}");
    let (ok, out) = run(&["--url", "http://127.0.0.1:9", "--shared-expert", "fold"]);
    assert!(!ok && out.contains("not with --url"), "{out}");
}
