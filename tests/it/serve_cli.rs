//! `serve`'s own options: the ones that choose how the model or its slots are built are refused
//! by name when misspelled, before anything is loaded or bound (a server that started on a
//! silently ignored option would run other kernels than asked).

use crate::common::example;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `serve ARGS`: `Some(stderr)` if it exited unsuccessfully within 30 s; `None` if it succeeded
/// or was still running then (it took the options and started serving: killed).
fn refused(args: &[&str]) -> Option<String> {
    let mut child = Command::new(example("serve"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            return (!status.success()).then_some(err);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    None
}

#[test]
fn serve_refuses_bad_build_options_by_name() {
    for (flag, bad) in [
        ("--shared-expert", "sideways"),
        ("--mamba-ssm-cache-dtype", "fp16"),
        ("--kv-cache-dtype", "int4"),
    ] {
        let err = refused(&[flag, bad, "--port", "0"]);
        assert!(
            err.as_ref()
                .is_some_and(|e| e.contains(flag) && e.contains(bad)),
            "serve {flag} {bad}: not refused by name ({err:?})"
        );
    }
}
