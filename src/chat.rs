//! The checkpoint's chat template, rendered with a real Jinja engine (minijinja with Python-style
//! string methods), including the template's reasoning switch (`enable_thinking`) where it has one.

use crate::error::Error;
use minijinja::{context, Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat template with the special-token strings it refers to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    pub source: String,
    pub bos_token: String,
    pub eos_token: String,
}

fn token_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// Reads `chat_template` from `tokenizer_config.json` (a string, or a list of named templates
    /// of which `default` is used), else `chat_template.jinja`. `Ok(None)` when there is none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, Error> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = if cfg_path.exists() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::Config {
                path: cfg_path.clone(),
                reason: e.to_string(),
            })?;
            serde_json::from_str(&text).map_err(|e| Error::Config {
                path: cfg_path.clone(),
                reason: format!("invalid JSON: {e}"),
            })?
        } else {
            Value::Null
        };
        let source = match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        let source = match source {
            Some(s) => s,
            None => {
                let p = dir.join("chat_template.jinja");
                if !p.exists() {
                    return Ok(None);
                }
                std::fs::read_to_string(&p).map_err(|e| Error::Config {
                    path: p,
                    reason: e.to_string(),
                })?
            }
        };
        Ok(Some(ChatTemplate {
            source,
            bos_token: token_string(cfg.get("bos_token")),
            eos_token: token_string(cfg.get("eos_token")),
        }))
    }

    /// Whether the template reads the reasoning switch.
    pub fn has_reasoning_switch(&self) -> bool {
        self.source.contains("enable_thinking")
    }

    /// Renders `messages` with the generation prompt appended. `reasoning` sets `enable_thinking`
    /// (refused if the template has no such switch); `None` leaves the template's default.
    pub fn render(&self, messages: &[Message], reasoning: Option<bool>) -> Result<String, Error> {
        if reasoning.is_some() && !self.has_reasoning_switch() {
            return Err(Error::NoReasoningSwitch);
        }
        let mut env = Environment::new();
        // A checkpoint's template is untrusted code: bounded in instructions and in output.
        env.set_fuel(Some(TEMPLATE_FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template("chat", &self.source)
            .map_err(|e| Error::Template(describe(&e)))?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| Error::Template(describe(&e)))?;
        let ctx = match reasoning {
            Some(r) => {
                context! { messages => minijinja::Value::from(minijinja::value::Serde(messages)), add_generation_prompt => true, bos_token => &self.bos_token,
                eos_token => &self.eos_token, enable_thinking => r }
            }
            None => {
                context! { messages => minijinja::Value::from(minijinja::value::Serde(messages)), add_generation_prompt => true, bos_token => &self.bos_token,
                eos_token => &self.eos_token }
            }
        };
        let mut out = Bounded {
            buf: Vec::new(),
            max: TEMPLATE_MAX_BYTES,
            over: false,
        };
        let rendered = tmpl.render_captured_to(ctx, &mut out);
        if out.over {
            return Err(Error::Template(format!(
                "the rendered prompt passed {} MiB (a template that builds without end?)",
                TEMPLATE_MAX_BYTES >> 20
            )));
        }
        match rendered {
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(Error::Template(format!(
                "the template ran past its budget of {TEMPLATE_FUEL} instructions (a loop that \
                 does not end?)"
            ))),
            Err(e) => Err(Error::Template(describe(&e))),
            Ok(_) => String::from_utf8(out.buf)
                .map_err(|_| Error::Template("the rendered prompt is not UTF-8".into())),
        }
    }
}

/// Instructions a chat template may execute per render (a real one renders a long conversation in
/// a few hundred thousand; a runaway loop stops within a second or so).
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// Bytes a rendered prompt may take.
pub const TEMPLATE_MAX_BYTES: usize = 64 << 20;

/// A writer that refuses to grow past `max` bytes (and says so in `over`).
struct Bounded {
    buf: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.max {
            self.over = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One line: the error and, where minijinja knows it, the template line.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    if let Some(line) = e.line() {
        s = format!("{s} (template line {line})");
    }
    s.replace('\n', " ")
}
