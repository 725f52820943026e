//! Log-probabilities in the two shapes OpenAI answers with: chat's `logprobs.content` entries and
//! the legacy completions object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
//! An echoed prompt's tokens come first in the legacy object, the first without values.
//! A token's text is its id decoded alone (a piece of a multi-byte character decodes to U+FFFD).

use nemotron::model::TokenLogprobs;
use nemotron::Tokenizer;
use serde_json::{json, Map, Value};

fn text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

/// One token of chat's `logprobs.content`: `token`, `logprob`, `bytes` (the UTF-8 of `token`)
/// and `top_logprobs` (the same for the most likely tokens, most likely first).
pub fn chat_entry(tok: &Tokenizer, lp: &TokenLogprobs) -> Value {
    let entry = |id: u32, logprob: f32| {
        let t = text(tok, id);
        let bytes: Vec<u8> = t.as_bytes().to_vec();
        json!({"token": t, "logprob": logprob, "bytes": bytes})
    };
    let mut e = entry(lp.token, lp.logprob);
    e["top_logprobs"] = Value::Array(lp.top.iter().map(|&(i, l)| entry(i, l)).collect());
    e
}

/// The legacy completions `logprobs` object of `tokens` (each with the character offset of its
/// text in the choice's text): `top_logprobs` maps each likely token's text to its
/// log-probability (tokens decoding to the same text keep the more likely one, as a dict does).
pub fn completion_object(tok: &Tokenizer, tokens: &[(TokenLogprobs, usize)]) -> Value {
    let entries: Vec<Entry> = tokens
        .iter()
        .map(|(lp, offset)| Entry {
            token: lp.token,
            lp: Some(lp),
            offset: *offset,
        })
        .collect();
    completion_entries(tok, &entries)
}

/// One token of a legacy `logprobs` object: its id, its log-probabilities where it has them (an
/// echoed prompt's first token has none: `null` in `token_logprobs` and `top_logprobs`), and the
/// character offset of its text.
pub struct Entry<'a> {
    pub token: u32,
    pub lp: Option<&'a TokenLogprobs>,
    pub offset: usize,
}

/// [`completion_object`] of entries some of which may have no values.
pub fn completion_entries(tok: &Tokenizer, entries: &[Entry]) -> Value {
    let mut texts = vec![];
    let mut values = vec![];
    let mut tops = vec![];
    let mut offsets = vec![];
    for e in entries {
        texts.push(Value::String(text(tok, e.token)));
        match e.lp {
            Some(lp) => {
                values.push(json!(lp.logprob));
                let mut top = Map::new();
                for &(i, l) in &lp.top {
                    top.entry(text(tok, i)).or_insert(json!(l));
                }
                tops.push(Value::Object(top));
            }
            None => {
                values.push(Value::Null);
                tops.push(Value::Null);
            }
        }
        offsets.push(json!(e.offset));
    }
    json!({"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}
