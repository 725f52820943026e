//! A model with its tokenizer, chat template and generation defaults: text in, streamed text out.

use crate::chat::{ChatTemplate, Message};
use crate::error::Error;
use crate::text::{TokenStream, Tokenizer};
use burn::tensor::{DType, Device};
use nemotron_loader::{Checkpoint, LoadOptions, LoadProgress};
use nemotron_model::{BuildOptions, GenerateOptions, NemotronH, Sampling, StopReason};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `generation_config.json` says (falling back to `config.json` for the EOS ids).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationDefaults {
    /// Every EOS id: generation stops on any of them.
    pub eos_token_ids: Vec<u32>,
    pub do_sample: bool,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
}

impl GenerationDefaults {
    pub fn from_dir(dir: &Path, config_eos: &[u32]) -> Result<Self, Error> {
        let p = dir.join("generation_config.json");
        let mut d = GenerationDefaults {
            eos_token_ids: config_eos.to_vec(),
            ..Default::default()
        };
        if !p.exists() {
            return Ok(d);
        }
        let text = std::fs::read_to_string(&p).map_err(|e| Error::Config {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: p.clone(),
            reason: format!("invalid JSON: {e}"),
        })?;
        match v.get("eos_token_id") {
            Some(Value::Array(a)) => {
                d.eos_token_ids = a
                    .iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as u32)
                    .collect()
            }
            Some(x) => {
                if let Some(n) = x.as_u64() {
                    d.eos_token_ids = vec![n as u32];
                }
            }
            None => {}
        }
        d.do_sample = v.get("do_sample").and_then(Value::as_bool).unwrap_or(false);
        d.temperature = v
            .get("temperature")
            .and_then(Value::as_f64)
            .map(|x| x as f32);
        d.top_k = v.get("top_k").and_then(Value::as_u64).map(|x| x as usize);
        d.top_p = v.get("top_p").and_then(Value::as_f64).map(|x| x as f32);
        Ok(d)
    }

    /// The checkpoint's sampling: its temperature/top-k/top-p when `do_sample`, else greedy.
    pub fn sampling(&self) -> Sampling {
        let mut s = Sampling::greedy();
        if self.do_sample {
            s.temperature = self.temperature.unwrap_or(1.0);
            s.top_k = self.top_k.unwrap_or(0);
            s.top_p = self.top_p.unwrap_or(1.0);
        }
        s
    }
}

/// The result of a text generation.
#[derive(Debug, Clone)]
pub struct TextGeneration {
    pub text: String,
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub stop: StopReason,
    pub prompt_seconds: f64,
    pub generation_seconds: f64,
}

impl TextGeneration {
    pub fn prompt_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    /// Tokens after the first, over the time after the first (decode speed).
    pub fn generation_tokens_per_second(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.generation_seconds.max(1e-9)
    }
}

/// A NemotronH model with the checkpoint's tokenizer, chat template and generation defaults.
pub struct TextModel {
    pub model: NemotronH,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub defaults: GenerationDefaults,
    pub dir: PathBuf,
}

impl TextModel {
    /// Loads with activations in `dtype` (f32 on the host; f32, bf16 or f16 on device backends).
    pub fn load(dir: impl AsRef<Path>, device: &Device, dtype: DType) -> Result<Self, Error> {
        Self::load_with_progress(dir, device, dtype, |_| {})
    }

    /// Loads, calling `progress` after each tensor (for a progress bar on long loads). The
    /// tokenizer is checked first so a missing one fails before gigabytes are read.
    pub fn load_with_progress(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: DType,
        progress: impl FnMut(LoadProgress),
    ) -> Result<Self, Error> {
        Self::load_with(dir, device, dtype, BuildOptions::default(), progress)
    }

    /// [`Self::load_with_progress`] with the model's weight layouts chosen by `opts`
    /// (`serve --shared-expert`).
    pub fn load_with(
        dir: impl AsRef<Path>,
        device: &Device,
        dtype: DType,
        opts: BuildOptions,
        progress: impl FnMut(LoadProgress),
    ) -> Result<Self, Error> {
        let dir = dir.as_ref();
        let tokenizer = Tokenizer::from_dir(dir)?;
        // A tokenizer that can produce ids past the embedding table is refused before the load.
        let (config, _) = nemotron_loader::read_config(dir)?;
        if tokenizer.id_bound() > config.vocab_size {
            return Err(Error::Tokenizer {
                path: dir.join("tokenizer.json"),
                reason: format!(
                    "the tokenizer's ids run to {}, past the model's vocab_size (config.json) {}",
                    tokenizer.id_bound() - 1,
                    config.vocab_size
                ),
            });
        }
        let chat_template = ChatTemplate::from_dir(dir)?;
        let ck = Checkpoint::load_with(
            dir,
            LoadOptions {
                progress: Some(Box::new(progress)),
            },
        )?;
        let defaults = GenerationDefaults::from_dir(dir, &ck.config.eos_token_ids)?;
        let model = NemotronH::from_checkpoint_with(ck, device, dtype, opts)?;
        Ok(TextModel {
            model,
            tokenizer,
            chat_template,
            defaults,
            dir: dir.into(),
        })
    }

    /// Options with the checkpoint's sampling and EOS ids.
    pub fn default_options(&self, max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens,
            sampling: self.defaults.sampling(),
            stop_ids: self.defaults.eos_token_ids.clone(),
            ..Default::default()
        }
    }

    /// Renders a chat prompt (optional system message, one user turn) with the checkpoint's
    /// template.
    pub fn chat_prompt(
        &self,
        system: Option<&str>,
        user: &str,
        reasoning: Option<bool>,
    ) -> Result<String, Error> {
        let t = self
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::NoChatTemplate(self.dir.clone()))?;
        let mut msgs = vec![];
        if let Some(s) = system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", user));
        t.render(&msgs, reasoning)
    }

    /// Generates after `prompt` (already rendered if it is a chat prompt: then it carries its own
    /// special tokens and none are added), streaming text pieces to `on_text`.
    pub fn generate_text(
        &self,
        prompt: &str,
        opts: GenerateOptions,
        on_text: impl FnMut(&str),
    ) -> Result<TextGeneration, Error> {
        self.generate_text_with_progress(prompt, opts, on_text, |_, _| {})
    }

    /// [`Self::generate_text`] with a prefill progress callback `(done, total)` per prompt chunk.
    #[allow(
        clippy::expect_used,
        reason = "the token iterator ends only after it has set a stop reason"
    )]
    pub fn generate_text_with_progress(
        &self,
        prompt: &str,
        opts: GenerateOptions,
        mut on_text: impl FnMut(&str),
        prefill_progress: impl FnMut(usize, usize),
    ) -> Result<TextGeneration, Error> {
        let is_chat = self
            .chat_template
            .as_ref()
            .is_some_and(|t| !t.bos_token.is_empty() && prompt.starts_with(&t.bos_token))
            || prompt.contains("<|im_start|>");
        let ids = self.tokenizer.encode(prompt, !is_chat)?;
        let t0 = Instant::now();
        let mut g = self.model.generator(&ids, opts)?;
        g.prefill(prefill_progress)?;
        let mut stream = TokenStream::new(&self.tokenizer);
        let mut text = String::new();
        let mut tokens = vec![];
        let mut first: Option<Instant> = None;
        for t in &mut g {
            let t = t?;
            first.get_or_insert_with(Instant::now);
            tokens.push(t);
            if let Some(piece) = stream.push(t)? {
                on_text(&piece);
                text.push_str(&piece);
            }
        }
        if let Some(piece) = stream.finish()? {
            on_text(&piece);
            text.push_str(&piece);
        }
        let end = Instant::now();
        let first = first.unwrap_or(end);
        Ok(TextGeneration {
            text,
            tokens,
            prompt_tokens: ids.len(),
            stop: g.stop_reason().expect("finished"),
            prompt_seconds: (first - t0).as_secs_f64(),
            generation_seconds: (end - first).as_secs_f64(),
        })
    }
}
