//! Shared helpers for the model tests.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron::model::NemotronH;
use safetensors::SafeTensors;
use std::path::PathBuf;

/// The host reference device (Flex; `hf_parity` also runs NdArray).
pub fn host() -> Device {
    Device::flex()
}

/// A checkpoint directory on the host reference (f32).
pub fn load_host(dir: impl AsRef<std::path::Path>) -> NemotronH {
    NemotronH::load_as(dir, &host(), DType::F32).unwrap()
}

pub fn synth(recipe: SynthRecipe, geom: &Geometry, seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions {
        recipe,
        seed,
        max_shard_bytes: 0,
        misalign: false,
    };
    write_checkpoint(dir.path(), geom, &opts).unwrap();
    dir
}

/// Any tensor as host f32.
pub fn rows<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

/// max |a - b| and max |b|.
pub fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let s = b.iter().fold(0f32, |m, y| m.max(y.abs()));
    (d, s)
}

/// Deterministic token ids in `[0, vocab)`.
pub fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = nemotron::kernels::rng::Lcg::new(seed);
    (0..n).map(|_| r.below(vocab as u64) as u32).collect()
}

/// mean |a - b|.
pub fn mean_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
}

/// GPT-2's byte → printable-char map used by ByteLevel tokenizers.
pub fn byte_char(b: u8) -> char {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for x in 0..256u32 {
        if !bs.contains(&x) {
            bs.push(x);
            cs.push(256 + n);
            n += 1;
        }
    }
    let i = bs.iter().position(|&x| x == b as u32).unwrap();
    char::from_u32(cs[i]).unwrap()
}

pub const SPECIALS: [(u32, &str); 4] = [
    (1, "<s>"),
    (2, "</s>"),
    (3, "<|im_start|>"),
    (4, "<|im_end|>"),
];

/// A byte-level BPE `tokenizer.json` over a 256-id vocabulary: id = byte, except ids 1–4, which
/// are the special tokens `<s>`, `</s>`, `<|im_start|>`, `<|im_end|>`. No merges, so every byte
/// of a multi-byte character is its own token.
pub fn tokenizer_json() -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        if !(1..=4).contains(&b) {
            vocab.insert(byte_char(b).to_string(), serde_json::json!(b));
        }
    }
    let mut added = vec![];
    for (id, s) in SPECIALS {
        vocab.insert(s.to_string(), serde_json::json!(id));
        added.push(serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

/// A chat template in the style of Nemotron's: ChatML turns, optional system turn, and a
/// reasoning switch (`enable_thinking`) that closes an empty think block when off.
pub const CHAT_TEMPLATE: &str = concat!(
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content.strip() + '<|im_end|>\\n' }}",
    "{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}\n",
    "{%- for m in rest %}{%- if m.role not in ['user', 'assistant'] %}{{- raise_exception('unknown role ' ~ m.role) }}{%- endif %}",
    "{{- '<|im_start|>' + m.role + '\\n' + m.content.strip() + '<|im_end|>\\n' }}{%- endfor %}\n",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}",
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think></think>' }}{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
);

/// Adds tokenizer.json, tokenizer_config.json (with the chat template) and generation_config.json
/// (EOS ids 2 and `extra_eos`) to a checkpoint directory.
pub fn add_text_files(dir: &std::path::Path, extra_eos: u32) {
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    let cfg = serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let gen = serde_json::json!({"eos_token_id": [2, extra_eos], "do_sample": false});
    std::fs::write(dir.join("generation_config.json"), gen.to_string()).unwrap();
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

pub struct Reference {
    pub prompt: Vec<u32>,
    pub prefill: Vec<f32>,
    pub decode_ids: Vec<u32>,
    pub decode: Vec<f32>,
}

pub fn reference(name: &str, suffix: &str) -> Reference {
    let buf = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&buf).unwrap();
    let f32s = |n: &str| -> Vec<f32> {
        st.tensor(n)
            .unwrap()
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let ids = |n: &str| -> Vec<u32> {
        st.tensor(n)
            .unwrap()
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    Reference {
        prompt: ids("prompt_ids"),
        prefill: f32s(&format!("prefill_logits{suffix}")),
        decode_ids: ids(&format!("decode_ids{suffix}")),
        decode: f32s(&format!("decode_logits{suffix}")),
    }
}

/// One more f32 tensor of a fixture's reference file (e.g. the `*_hf_bf16` logits).
pub fn reference_extra(name: &str, tensor: &str) -> Vec<f32> {
    let buf = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&buf).unwrap();
    let t = st
        .tensor(tensor)
        .unwrap_or_else(|e| panic!("{name}/reference.safetensors: {tensor}: {e}"));
    t.data()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// max |a - b| of each row of `width` values.
pub fn row_diffs(a: &[f32], b: &[f32], width: usize) -> Vec<f32> {
    assert_eq!(a.len(), b.len());
    a.chunks(width)
        .zip(b.chunks(width))
        .map(|(x, y)| diff(x, y).0)
        .collect()
}

/// Per-row max |Δ| of a model against a reference (prefill rows, teacher-forced decode rows) and
/// the logit scale.
pub fn compare_rows(m: &NemotronH, r: &Reference) -> (Vec<f32>, Vec<f32>, f32) {
    let v = r.prefill.len() / r.prompt.len();
    let mut s = m.new_state();
    let prefill = rows(m.forward_one(&r.prompt, &mut s).unwrap());
    let scale = diff(&prefill, &r.prefill).1;
    let mut s = m.new_state();
    let mut dec = nemotron::model::generate::last_row(m.forward_one(&r.prompt, &mut s).unwrap());
    for &id in &r.decode_ids[..r.decode_ids.len() - 1] {
        dec.extend(rows(m.forward_one(&[id], &mut s).unwrap()));
    }
    (
        row_diffs(&prefill, &r.prefill, v),
        row_diffs(&dec, &r.decode, v),
        scale,
    )
}

/// (prefill max |Δ|, decode max |Δ|, logit scale) of a model against a reference.
pub fn compare(m: &NemotronH, r: &Reference) -> (f32, f32, f32) {
    let mut s = m.new_state();
    let prefill = rows(m.forward_one(&r.prompt, &mut s).unwrap());
    let (dp, scale) = diff(&prefill, &r.prefill);
    eprintln!("  prefill mean |Δ| {:.3e}", mean_diff(&prefill, &r.prefill));
    // Teacher-forced decode: row 0 after the prompt, row i after feeding decode_ids[i-1].
    let mut s = m.new_state();
    let mut dec = nemotron::model::generate::last_row(m.forward_one(&r.prompt, &mut s).unwrap());
    for &id in &r.decode_ids[..r.decode_ids.len() - 1] {
        dec.extend(rows(m.forward_one(&[id], &mut s).unwrap()));
    }
    let (dd, _) = diff(&dec, &r.decode);
    eprintln!("  decode mean |Δ| {:.3e}", mean_diff(&dec, &r.decode));
    (dp, dd, scale)
}

/// The `parity` example built next to the test binary (`target/<profile>/examples/parity`);
/// fails, naming the path, where the examples were not built.
pub fn parity_example() -> PathBuf {
    example("parity")
}

/// The built example `name` (`cargo test` builds the examples beside the test binaries).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join(name))
        .unwrap();
    assert!(
        bin.exists(),
        "{} is missing: build the examples first",
        bin.display()
    );
    bin
}

/// Runs the example `name` with `args`: whether it succeeded, and its stdout then stderr.
pub fn run_example(name: &str, args: &[&str]) -> (bool, String) {
    let o = std::process::Command::new(example(name))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

/// Teacher-forced decode rows through one slot: row 0 after the prompt (prefilled into the
/// slot), row `i` after feeding `decode_ids[i − 1]` through `decode_slots`.
pub fn slot_decode(m: &NemotronH, r: &Reference) -> Vec<f32> {
    let n = r.decode_ids.len();
    let dev = m.device().clone();
    let mut st = m.new_slots(1, r.prompt.len() + n).unwrap();
    let mut dec = rows(m.prefill_slots(&mut st, &[&r.prompt], &[0]).unwrap());
    let slot = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32], [1]), (&dev, DType::I32));
    for &id in &r.decode_ids[..n - 1] {
        let ids = Tensor::<2, Int>::from_data(
            TensorData::new(vec![id as i32], [1, 1]),
            (&dev, DType::I32),
        );
        dec.extend(rows(m.decode_slots(&mut st, &ids, &slot)));
        st.note_step(&[0]);
    }
    dec
}

/// A slot-cache option (`change`: the FP8 KV cache, the bf16 SSM state) against HF's f32
/// goldens, decoding through a slot on `dev` for `lightning_mixed` (W8A16) and `all_letters`:
/// the plain slots within 1e-5 of the logit scale, the changed ones within `band` of it, and
/// moved by more than 10× the plain error (an option that changed nothing would pass unseen).
pub fn check_slot_option(
    dev: &Device,
    what: &str,
    band: f32,
    change: impl Fn(NemotronH) -> NemotronH,
) {
    use nemotron::model::Deviations;
    let w8a16 = Deviations {
        fp8_weight_only: true,
        ..Default::default()
    };
    for (name, suffix, d) in [
        ("lightning_mixed", "_w8a16", w8a16),
        ("all_letters", "", Deviations::default()),
    ] {
        let r = reference(name, suffix);
        let m = NemotronH::load_with_deviations(fixture(name), dev, DType::F32, d).unwrap();
        let plain = slot_decode(&m, &r);
        let changed = slot_decode(&change(m), &r);
        let (dp, scale) = diff(&plain, &r.decode);
        let (dc, _) = diff(&changed, &r.decode);
        eprintln!(
            "{dev:?} {name}{suffix}: decode through a slot, plain max |Δ| {dp:.3e}, {what} {dc:.3e} \
             (mean {:.3e}), scale {scale:.3}, band {:.3e}",
            mean_diff(&changed, &r.decode),
            band * scale
        );
        assert!(
            dp <= 1e-5 * scale,
            "{name}{suffix}: the plain slots are off HF by {dp} (scale {scale})"
        );
        assert!(
            dc <= band * scale,
            "{name}{suffix}: the {what} is off HF by {dc} > {band} × {scale}"
        );
        assert!(
            dc > 10.0 * dp,
            "{name}{suffix}: the {what} moved nothing ({dc} vs {dp})"
        );
    }
}
