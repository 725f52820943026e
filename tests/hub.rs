//! Hub model ids resolved against a cache directory laid out as the Hub lays it out
//! (`models--owner--name/{refs,snapshots,blobs}`, snapshot files symlinked to blobs), offline.
//! One test: the environment variables it sets are process-wide.

use nemotron::hub::{cache_dir, resolve_model};
use nemotron::synth_text::write_tiny_text_checkpoint;
use nemotron::{DType, TextModel};
use std::path::Path;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba98";

/// Moves every file of `src` into `repo/blobs/<name>` and links it from `snapshots/<commit>/`.
fn lay_out(src: &Path, repo: &Path, commit: &str) {
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let blob = format!("{commit}-{name}");
        std::fs::copy(e.path(), repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), snap.join(&name)).unwrap();
    }
}

#[test]
fn hub_ids_resolve_through_the_cache_offline() {
    let root = tempfile::tempdir().unwrap();
    let hub = root.path().join("hub");
    let repo = hub.join("models--acme--tiny-nemotron");
    let ck = tempfile::tempdir().unwrap();
    write_tiny_text_checkpoint(ck.path(), 3).unwrap();
    lay_out(ck.path(), &repo, COMMIT);
    lay_out(ck.path(), &repo, OTHER);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), format!("{COMMIT}\n")).unwrap();
    std::fs::write(repo.join("refs/v2"), OTHER).unwrap();

    std::env::remove_var("HF_HUB_CACHE");
    std::env::set_var("HF_HOME", root.path());
    std::env::set_var("HF_HUB_OFFLINE", "1");
    assert_eq!(cache_dir().unwrap(), hub, "HF_HOME/hub");

    let main = resolve_model("acme/tiny-nemotron", None).unwrap();
    assert_eq!(main, repo.join("snapshots").join(COMMIT));
    let tm = TextModel::load(&main, &burn::tensor::Device::flex(), DType::F32.burn()).unwrap();
    assert!(
        tm.chat_template.is_some(),
        "the chat template came through the symlinks"
    );
    assert_eq!(
        resolve_model("acme/tiny-nemotron", Some("v2")).unwrap(),
        repo.join("snapshots").join(OTHER),
        "a named ref"
    );
    assert_eq!(
        resolve_model("acme/tiny-nemotron", Some(OTHER)).unwrap(),
        repo.join("snapshots").join(OTHER),
        "a commit hash with no ref"
    );

    let e = resolve_model("acme/missing", None).unwrap_err().to_string();
    assert!(
        e.contains("acme/missing")
            && e.contains("HF_HUB_OFFLINE")
            && e.contains(&hub.display().to_string()),
        "{e}"
    );
    let e = resolve_model("acme/tiny-nemotron", Some("nope"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nope") && e.contains("not in the Hub cache"),
        "{e}"
    );

    // HF_HUB_CACHE wins over HF_HOME.
    let elsewhere = tempfile::tempdir().unwrap();
    std::env::set_var("HF_HUB_CACHE", elsewhere.path());
    assert!(
        resolve_model("acme/tiny-nemotron", None).is_err(),
        "HF_HUB_CACHE was not used"
    );
    std::env::set_var("HF_HUB_CACHE", &hub);
    assert_eq!(resolve_model("acme/tiny-nemotron", None).unwrap(), main);

    // A directory stays a directory; --revision on one is refused; neither is refused by name.
    assert_eq!(
        resolve_model(ck.path().to_str().unwrap(), None).unwrap(),
        ck.path()
    );
    let e = resolve_model(ck.path().to_str().unwrap(), Some("main"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--revision"), "{e}");
    let e = resolve_model("/no/such/dir", None).unwrap_err().to_string();
    assert!(e.contains("/no/such/dir"), "{e}");
    // A ref file that is not a commit is refused naming it.
    std::fs::write(repo.join("refs/bad"), "../../etc").unwrap();
    let e = resolve_model("acme/tiny-nemotron", Some("bad"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("refs/bad") && e.contains("not a commit"), "{e}");
}
