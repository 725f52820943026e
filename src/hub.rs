//! `--model` as a directory or a Hugging Face Hub id (`owner/name`), resolved through the Hub's
//! own cache layout (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`):
//! `models--owner--name/refs/<revision>` names a commit, `snapshots/<commit>/` holds the files.
//! What is not cached is downloaded with `hf-hub` (a progress bar per file), unless
//! `HF_HUB_OFFLINE=1`, in which case only the cache is read.

use crate::error::Error;
use std::path::{Path, PathBuf};

/// Files a checkpoint directory may need besides its safetensors shards.
const TEXT_FILES: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "hf_quant_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "model.safetensors.index.json",
];

/// The Hub cache's root directory, as `huggingface_hub` finds it.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE").filter(|p| !p.is_empty()) {
        return Some(p.into());
    }
    if let Some(p) = std::env::var_os("HF_HOME").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME")
        .filter(|p| !p.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

/// Whether `HF_HUB_OFFLINE` asks for the cache only (`1`, `true`, `yes`, `on`).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Whether `s` reads as a Hub id: `owner/name`, each part of letters, digits, `-`, `_`, `.`.
pub fn is_hub_id(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(s.split('/').collect::<Vec<_>>().as_slice(), [o, n] if ok(o) && ok(n))
}

/// A directory stays a directory; a Hub id is resolved in the cache (and downloaded when missing,
/// unless offline). `revision` defaults to `main`.
pub fn resolve_model(spec: &str, revision: Option<&str>) -> Result<PathBuf, Error> {
    let p = Path::new(spec);
    if p.is_dir() {
        if revision.is_some() {
            return Err(Error::Unavailable(format!(
                "--revision applies to Hub ids; {spec} is a local directory"
            )));
        }
        return Ok(p.into());
    }
    if !is_hub_id(spec) {
        return Err(Error::MissingFile {
            path: p.into(),
            what: "a checkpoint directory (or a Hub id such as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4)".into(),
        });
    }
    let cache = cache_dir().ok_or_else(|| {
        Error::Unavailable("no Hub cache: set HF_HOME or HF_HUB_CACHE (HOME is unset)".into())
    })?;
    let revision = revision.unwrap_or("main");
    match cached_snapshot(&cache, spec, revision)? {
        Some(dir) => Ok(dir),
        None if offline() => Err(Error::Unavailable(format!(
            "{spec} (revision {revision}) is not in the Hub cache {} and HF_HUB_OFFLINE is set",
            cache.display()
        ))),
        None => download(&cache, spec, revision),
    }
}

/// The snapshot directory for `id` at `revision` if the cache holds one with a `config.json`.
pub fn cached_snapshot(cache: &Path, id: &str, revision: &str) -> Result<Option<PathBuf>, Error> {
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let refs = repo.join("refs").join(revision);
    let commit = if refs.is_file() {
        let c = std::fs::read_to_string(&refs).map_err(|e| Error::Config {
            path: refs.clone(),
            reason: e.to_string(),
        })?;
        let c = c.trim().to_string();
        if c.is_empty() || c.contains(['/', '\\']) || c.starts_with('.') {
            return Err(Error::Config {
                path: refs,
                reason: format!("not a commit hash: {c:?}"),
            });
        }
        c
    } else if revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()) {
        revision.to_string()
    } else {
        return Ok(None);
    };
    let snap = repo.join("snapshots").join(&commit);
    Ok(snap.join("config.json").is_file().then_some(snap))
}

fn download(cache: &Path, id: &str, revision: &str) -> Result<PathBuf, Error> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Error::Unavailable(format!("{id} (revision {revision}): {what}: {e}"))
    };
    let api = ApiBuilder::from_cache(Cache::new(cache.into()))
        .with_progress(true)
        .build()
        .map_err(|e| fail("Hub client", &e))?;
    let repo = api.repo(Repo::with_revision(
        id.into(),
        RepoType::Model,
        revision.into(),
    ));
    let info = repo
        .info()
        .map_err(|e| fail("listing the repository", &e))?;
    let wanted: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| TEXT_FILES.contains(f) || (f.ends_with(".safetensors") && !f.contains('/')))
        .collect();
    if !wanted.contains(&"config.json") {
        return Err(Error::Unavailable(format!(
            "{id} (revision {revision}) has no config.json: not a model checkpoint"
        )));
    }
    let mut dir = None;
    for f in wanted {
        let p = repo.get(f).map_err(|e| fail(f, &e))?;
        dir.get_or_insert_with(|| p.parent().map(Path::to_path_buf).unwrap_or_default());
    }
    dir.ok_or_else(|| fail("download", &"no files"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_and_paths_are_told_apart() {
        assert!(is_hub_id("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"));
        assert!(!is_hub_id("/models/x"));
        assert!(!is_hub_id("a/b/c"));
        assert!(!is_hub_id("../x"));
        assert!(!is_hub_id("x"));
    }
}
