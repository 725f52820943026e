//! The checkpoint's tokenizer (`tokenizer.json`) and incremental detokenization that never emits
//! a broken multi-byte character.

use crate::error::Error;
use std::path::{Path, PathBuf};

/// A Hugging Face `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokenizer({}, vocab {})",
            self.path.display(),
            self.inner.get_vocab_size(true)
        )
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::MissingFile {
                path,
                what:
                    "tokenizer.json (needed for text prompts; use --prompt-ids to pass token ids)"
                        .into(),
            });
        }
        Self::from_file(&path)
    }

    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Tokenizer {
            path: path.into(),
            reason: e.to_string(),
        })?;
        Ok(Tokenizer {
            inner,
            path: path.into(),
        })
    }

    /// Encodes text. `add_special` lets the tokenizer's post-processor add BOS etc. (off for a
    /// rendered chat prompt, which carries its own special tokens).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, Error> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| Error::Tokenizer {
                path: self.path.clone(),
                reason: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids, dropping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        self.inner.decode(ids, true).map_err(|e| Error::Tokenizer {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// One past the largest id the tokenizer can produce (added tokens included).
    pub fn id_bound(&self) -> usize {
        self.inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Turns a stream of token ids into a stream of text pieces whose concatenation is the decoded
/// text. A piece is released only when the decoded text no longer ends in an incomplete
/// character (U+FFFD), and each piece is decoded with one token of left context so tokenizers
/// that strip a leading space decode words correctly.
///
/// Generic over how the tokenizer is held (`&Tokenizer`, `Arc<Tokenizer>`), so a stream can live
/// in a task that owns its share of it.
pub struct TokenStream<T: std::ops::Deref<Target = Tokenizer>> {
    tok: T,
    ids: Vec<u32>,
    prev: usize,
    cur: usize,
}

impl<T: std::ops::Deref<Target = Tokenizer>> TokenStream<T> {
    pub fn new(tok: T) -> Self {
        TokenStream {
            tok,
            ids: vec![],
            prev: 0,
            cur: 0,
        }
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, Error> {
        let before = self.tok.decode(&self.ids[self.prev..self.cur])?;
        self.ids.push(id);
        let text = self.tok.decode(&self.ids[self.prev..])?;
        if text.len() > before.len() && !text.ends_with('\u{FFFD}') && text.starts_with(&before) {
            let piece = text[before.len()..].to_string();
            self.prev = self.cur;
            self.cur = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// The text still held back (an incomplete character at the very end is released as is).
    pub fn finish(&mut self) -> Result<Option<String>, Error> {
        let before = self.tok.decode(&self.ids[self.prev..self.cur])?;
        let text = self.tok.decode(&self.ids[self.prev..])?;
        self.prev = self.ids.len();
        self.cur = self.ids.len();
        Ok(text
            .strip_prefix(before.as_str())
            .filter(|r| !r.is_empty())
            .map(str::to_string))
    }
}
