//! Text files for a synthetic checkpoint: a byte-level tokenizer, a ChatML-style chat template with
//! a reasoning switch, and the generation defaults, so a tiny random model round-trips text (the
//! embedded defaults of `generate` and `serve`, and the server's tests).
//!
//! The vocabulary fits in 256 ids: 8 special tokens, then one token per byte value that can occur
//! in UTF-8 (243 of them: 0xC0, 0xC1 and 0xF5–0xFF never do). Every UTF-8 string encodes to bytes
//! and decodes back exactly; ids past the vocabulary (a random model emits them) decode to nothing.

use crate::error::Error;
use serde_json::{json, Map, Value};
use std::path::Path;

/// The special tokens, in id order.
pub const SPECIAL_TOKENS: [&str; 8] = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<pad>",
];

/// `<s>`, `</s>` and `<|im_end|>`: the ids `generation_config.json` stops on.
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;
pub const IM_END_ID: u32 = 4;

/// Ids the byte tokenizer uses (specials + the 243 UTF-8 byte values).
pub const BYTE_VOCAB: usize = SPECIAL_TOKENS.len() + 243;

/// A ChatML-style template like the released checkpoints' own: the assistant turn opens with
/// `<think>\n`, or with an empty `<think></think>` when `enable_thinking` is false.
pub const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think></think>{% else %}<think>\n{% endif %}{% endif %}";

/// GPT-2's byte → printable character table (what the ByteLevel pre-tokenizer emits).
#[allow(clippy::expect_used, reason = "256 + n < 512 is a valid scalar value")]
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("below U+0200")
}

fn in_utf8(b: u8) -> bool {
    !(b == 0xC0 || b == 0xC1 || b >= 0xF5)
}

/// `tokenizer.json` for the byte tokenizer.
pub fn byte_tokenizer_json() -> Value {
    let mut vocab = Map::new();
    let mut added = vec![];
    for (i, t) in SPECIAL_TOKENS.iter().enumerate() {
        vocab.insert(t.to_string(), json!(i));
        added.push(json!({
            "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true
        }));
    }
    let mut id = SPECIAL_TOKENS.len();
    for b in (0..=255u8).filter(|&b| in_utf8(b)) {
        vocab.insert(byte_char(b).to_string(), json!(id));
        id += 1;
    }
    debug_assert_eq!(id, BYTE_VOCAB);
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": []
        }
    })
}

/// Writes `tokenizer.json`, `tokenizer_config.json` (chat template, BOS/EOS strings) and
/// `generation_config.json` (greedy, stopping on `</s>` and `<|im_end|>`) into `dir`. Refused if
/// the model's vocabulary is smaller than the tokenizer's.
pub fn write_text_files(dir: &Path, vocab_size: usize) -> Result<(), Error> {
    if vocab_size < BYTE_VOCAB {
        return Err(Error::Unavailable(format!(
            "the byte tokenizer needs a vocabulary of {BYTE_VOCAB} ids; the model has {vocab_size}"
        )));
    }
    let write = |name: &str, v: Value| -> Result<(), Error> {
        let p = dir.join(name);
        let text = serde_json::to_string_pretty(&v).map_err(|e| Error::Config {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        std::fs::write(&p, text).map_err(|e| Error::Config {
            path: p,
            reason: format!("cannot write: {e}"),
        })
    };
    write("tokenizer.json", byte_tokenizer_json())?;
    write(
        "tokenizer_config.json",
        json!({
            "bos_token": SPECIAL_TOKENS[BOS_ID as usize],
            "eos_token": SPECIAL_TOKENS[IM_END_ID as usize],
            "chat_template": CHAT_TEMPLATE,
        }),
    )?;
    write(
        "generation_config.json",
        json!({"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, IM_END_ID], "do_sample": false}),
    )
}

/// The embedded default of `generate` and `serve`: the tiny synthetic Lightning-style checkpoint
/// (MIXED NVFP4 + FP8 + BF16, random weights) with the byte tokenizer and chat template.
pub fn write_tiny_text_checkpoint(dir: &Path, seed: u64) -> Result<(), Error> {
    use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
    let g = Geometry::tiny();
    let opts = SynthOptions {
        recipe: SynthRecipe::LightningMixed,
        seed,
        max_shard_bytes: 0,
        misalign: false,
    };
    write_checkpoint(dir, &g, &opts)?;
    write_text_files(dir, g.vocab_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_table_is_a_bijection() {
        let chars: std::collections::BTreeSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
    }
}
