//! Malformed checkpoints: each is refused with an error that names the culprit, and none panics.
//! One odd-offset checkpoint must load, with the same values as its aligned twin.

use nemotron_loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
use nemotron_loader::Checkpoint;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

struct Ck {
    dir: tempfile::TempDir,
}

impl Ck {
    fn new(recipe: SynthRecipe, shard_bytes: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let opts = SynthOptions {
            recipe,
            seed: 11,
            max_shard_bytes: shard_bytes,
            misalign: false,
        };
        write_checkpoint(dir.path(), &Geometry::tiny(), &opts).unwrap();
        Ck { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn edit_json(&self, file: &str, f: impl FnOnce(&mut Value)) {
        let p = self.path().join(file);
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
    /// The shard file that holds `tensor`.
    fn shard_of(&self, tensor: &str) -> PathBuf {
        let idx = self.path().join("model.safetensors.index.json");
        if !idx.exists() {
            return self.path().join("model.safetensors");
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(idx).unwrap()).unwrap();
        self.path().join(
            v["weight_map"][tensor]
                .as_str()
                .unwrap_or_else(|| panic!("{tensor} not in index")),
        )
    }
    /// Rewrites the shard holding `tensor` after `f` edits its (name, dtype, shape, bytes) list.
    fn edit_shard(&self, tensor: &str, f: impl FnOnce(&mut Vec<Raw>)) -> PathBuf {
        let p = self.shard_of(tensor);
        let mut ts = read_raw(&p);
        f(&mut ts);
        write_raw(&p, &ts);
        p
    }
    /// Removes `tensor` from its shard and from the index.
    fn drop_tensor(&self, tensor: &str) {
        self.edit_shard(tensor, |ts| ts.retain(|t| t.name != tensor));
        self.edit_json("model.safetensors.index.json", |v| {
            v["weight_map"].as_object_mut().unwrap().remove(tensor);
        });
    }
    fn index_set(&self, tensor: &str, file: &str) {
        self.edit_json("model.safetensors.index.json", |v| {
            v["weight_map"][tensor] = json!(file)
        });
    }
    /// Loads, requires a refusal (not a panic) and returns its message.
    fn refused(&self) -> String {
        let p = self.path().to_path_buf();
        let r = std::panic::catch_unwind(move || Checkpoint::load(&p))
            .expect("the loader panicked instead of refusing");
        match r {
            Ok(_) => panic!("the malformed checkpoint loaded"),
            Err(e) => {
                let m = e.to_string();
                eprintln!("REFUSED: {m}");
                m
            }
        }
    }
}

#[derive(Clone)]
struct Raw {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn read_raw(p: &Path) -> Vec<Raw> {
    let buf = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(buf[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&buf[8..8 + n]).unwrap();
    let mut out: Vec<(usize, Raw)> = vec![];
    for (name, info) in h.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let o: Vec<usize> = info["data_offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        out.push((
            o[0],
            Raw {
                name: name.clone(),
                dtype: info["dtype"].as_str().unwrap().into(),
                shape: info["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as usize)
                    .collect(),
                bytes: buf[8 + n + o[0]..8 + n + o[1]].to_vec(),
            },
        ));
    }
    out.sort_by_key(|x| x.0);
    out.into_iter().map(|x| x.1).collect()
}

fn write_raw(p: &Path, ts: &[Raw]) {
    let mut h = serde_json::Map::new();
    let mut off = 0;
    for t in ts {
        h.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.bytes.len()]}),
        );
        off += t.bytes.len();
    }
    let mut hs = serde_json::to_string(&Value::Object(h)).unwrap();
    while hs.len() % 8 != 0 {
        hs.push(' ');
    }
    let mut out = (hs.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(hs.as_bytes());
    for t in ts {
        out.extend_from_slice(&t.bytes);
    }
    std::fs::write(p, out).unwrap();
}

fn mentions(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} should mention {n:?}");
    }
}

const LM: SynthRecipe = SynthRecipe::LightningMixed;
const SHARD: u64 = 32 << 10;
const IN_PROJ: &str = "backbone.layers.0.mixer.in_proj";

#[test]
fn truncated_shard() {
    let ck = Ck::new(LM, SHARD);
    let p = ck.shard_of("backbone.norm_f.weight");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    mentions(
        &ck.refused(),
        &[p.file_name().unwrap().to_str().unwrap(), "truncated"],
    );
}

#[test]
fn bad_header_json() {
    let ck = Ck::new(LM, SHARD);
    let p = ck.shard_of("backbone.norm_f.weight");
    let mut b = std::fs::read(&p).unwrap();
    b[8] = b'['; // the header no longer parses as an object
    b[9] = b'}';
    std::fs::write(&p, &b).unwrap();
    mentions(
        &ck.refused(),
        &[p.file_name().unwrap().to_str().unwrap(), "JSON"],
    );
}

#[test]
fn header_length_past_eof() {
    let ck = Ck::new(LM, SHARD);
    let p = ck.shard_of("backbone.norm_f.weight");
    let mut b = std::fs::read(&p).unwrap();
    let too_long = (b.len() as u64 * 4).to_le_bytes();
    b[..8].copy_from_slice(&too_long);
    std::fs::write(&p, &b).unwrap();
    mentions(
        &ck.refused(),
        &[
            p.file_name().unwrap().to_str().unwrap(),
            "header length",
            "past the end",
        ],
    );
}

#[test]
fn file_shorter_than_header_length_field() {
    let ck = Ck::new(LM, 0);
    std::fs::write(ck.path().join("model.safetensors"), [1u8, 2, 3]).unwrap();
    mentions(&ck.refused(), &["model.safetensors", "8-byte"]);
}

#[test]
fn data_offsets_disagree_with_shape() {
    let ck = Ck::new(LM, SHARD);
    let p = ck.shard_of("backbone.norm_f.weight");
    let mut ts = read_raw(&p);
    let t = ts
        .iter_mut()
        .find(|t| t.name == "backbone.norm_f.weight")
        .unwrap();
    t.shape = vec![t.shape[0] + 1]; // header shape now needs 2 more bytes than the range has
    write_raw(&p, &ts);
    mentions(&ck.refused(), &["backbone.norm_f.weight", "data_offsets"]);
}

#[test]
fn dtype_mismatch_fp8_declared_but_u8_shipped() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_shard(&format!("{IN_PROJ}.weight"), |ts| {
        ts.iter_mut()
            .find(|t| t.name == format!("{IN_PROJ}.weight"))
            .unwrap()
            .dtype = "U8".into();
    });
    mentions(
        &ck.refused(),
        &[
            "backbone.layers.0.mixer.in_proj.weight",
            "U8",
            "F8_E4M3",
            "FP8",
        ],
    );
}

#[test]
fn unsupported_dtype() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.0.norm.weight";
    ck.edit_shard(name, |ts| {
        let t = ts.iter_mut().find(|t| t.name == name).unwrap();
        t.dtype = "I16".into(); // same byte size as BF16
    });
    mentions(&ck.refused(), &[name, "I16"]);
}

#[test]
fn shape_mismatch() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.3.mixer.out_proj.weight"; // FP8 [64, 64]
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().shape = vec![32, 128];
    });
    mentions(&ck.refused(), &[name, "[32, 128]", "[64, 64]"]);
}

#[test]
fn transposed_nvfp4_orientation() {
    // Block scales shaped [in/16, out]: orientation is checked, not just the byte count.
    let ck = Ck::new(LM, SHARD);
    let ws = "backbone.layers.1.mixer.experts.0.up_proj.weight_scale"; // [32, 4]
    ck.edit_shard(ws, |ts| {
        ts.iter_mut().find(|t| t.name == ws).unwrap().shape = vec![4, 32];
    });
    mentions(&ck.refused(), &[ws, "[4, 32]", "[32, 4]"]);
}

#[test]
fn missing_tensor() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.3.mixer.conv1d.bias";
    ck.drop_tensor(name);
    mentions(&ck.refused(), &[name, "missing", "Mamba2"]);
}

#[test]
fn unexpected_tensor() {
    let ck = Ck::new(LM, SHARD);
    let anchor = "backbone.norm_f.weight";
    let extra = "backbone.layers.0.mixer.in_proj.bias";
    let p = ck.edit_shard(anchor, |ts| {
        ts.push(Raw {
            name: extra.into(),
            dtype: "BF16".into(),
            shape: vec![4],
            bytes: vec![0; 8],
        });
    });
    ck.index_set(extra, p.file_name().unwrap().to_str().unwrap());
    mentions(&ck.refused(), &[extra, "unexpected"]);
}

#[test]
fn tensor_missing_from_index() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.norm_f.weight";
    ck.edit_json("model.safetensors.index.json", |v| {
        v["weight_map"].as_object_mut().unwrap().remove(name);
    });
    mentions(&ck.refused(), &["index", name]);
}

#[test]
fn index_maps_tensor_to_wrong_shard() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.norm_f.weight";
    let other = ck.shard_of("lm_head.weight");
    assert_ne!(other, ck.shard_of(name));
    ck.index_set(name, other.file_name().unwrap().to_str().unwrap());
    mentions(&ck.refused(), &["index", name]);
}

#[test]
fn index_names_missing_shard() {
    let ck = Ck::new(LM, SHARD);
    let p = ck.shard_of("lm_head.weight");
    std::fs::remove_file(&p).unwrap();
    mentions(
        &ck.refused(),
        &[p.file_name().unwrap().to_str().unwrap(), "does not exist"],
    );
}

#[test]
fn duplicate_tensor_across_shards() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.norm_f.weight";
    let dup = ck.edit_shard(name, |_| {}).clone();
    let other = ck.shard_of("lm_head.weight");
    let t = read_raw(&dup).into_iter().find(|t| t.name == name).unwrap();
    let mut ts = read_raw(&other);
    ts.push(t);
    write_raw(&other, &ts);
    mentions(&ck.refused(), &[name, "twice"]);
}

#[test]
fn no_weights_at_all() {
    let ck = Ck::new(LM, 0);
    std::fs::remove_file(ck.path().join("model.safetensors")).unwrap();
    mentions(&ck.refused(), &["model.safetensors"]);
}

#[test]
fn unknown_quant_algo() {
    let ck = Ck::new(SynthRecipe::NanoNvfp4, SHARD);
    ck.edit_json("hf_quant_config.json", |v| {
        v["quantization"]["quant_algo"] = json!("INT3")
    });
    mentions(&ck.refused(), &["hf_quant_config.json", "INT3"]);
}

#[test]
fn unsupported_fp8_variant_in_mixed_map() {
    let ck = Ck::new(LM, SHARD);
    for f in ["config.json", "hf_quant_config.json"] {
        ck.edit_json(f, |v| {
            let q = if f == "config.json" {
                &mut v["quantization_config"]
            } else {
                &mut v["quantization"]
            };
            q["quantized_layers"][IN_PROJ] = json!({"quant_algo": "FP8_PB_WO"});
        });
    }
    mentions(&ck.refused(), &["FP8_PB_WO", IN_PROJ]);
}

#[test]
fn group_size_32() {
    let ck = Ck::new(SynthRecipe::NanoNvfp4, SHARD);
    ck.edit_json("hf_quant_config.json", |v| {
        v["quantization"]["group_size"] = json!(32)
    });
    mentions(&ck.refused(), &["group_size", "32"]);
}

#[test]
fn recipe_files_disagree() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("hf_quant_config.json", |v| {
        v["quantization"]["quantized_layers"][IN_PROJ] =
            json!({"quant_algo": "W4A16_NVFP4", "group_size": 16});
    });
    mentions(&ck.refused(), &["config.json", "hf_quant_config.json"]);
}

#[test]
fn missing_eps() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("config.json", |v| {
        let m = v.as_object_mut().unwrap();
        m.remove("layer_norm_epsilon");
        m.remove("norm_eps");
    });
    mentions(&ck.refused(), &["layer_norm_epsilon", "never defaulted"]);
}

#[test]
fn eps_falls_back_to_norm_eps_then_rms_norm_eps() {
    let ck = Ck::new(SynthRecipe::Bf16, SHARD);
    ck.edit_json("config.json", |v| {
        let m = v.as_object_mut().unwrap();
        m.remove("layer_norm_epsilon");
        m.remove("norm_eps");
        m.insert("rms_norm_eps".into(), json!(1e-6));
    });
    let c = Checkpoint::load(ck.path()).unwrap();
    assert_eq!(
        (c.config.norm_eps, c.config.norm_eps_field),
        (1e-6, "rms_norm_eps")
    );
}

/// A config claiming 10^9 routed experts is refused by name, at once: the refusal's cost must not
/// grow with the claim (the plan enumerates every claimed expert; before the check it ran for
/// minutes and gigabytes).
#[test]
fn a_million_experts_are_refused_before_the_plan() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("config.json", |v| {
        v["n_routed_experts"] = json!(1_000_000u64)
    });
    let t0 = std::time::Instant::now();
    let msg = ck.refused();
    mentions(
        &msg,
        &["n_routed_experts", "1000000", "the checkpoint holds"],
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(2),
        "refusing took {:?}",
        t0.elapsed()
    );
}

/// Sizes past the loader's bound are refused by name before anything derives from them (the
/// fuzz test found products of such fields overflowing).
#[test]
fn config_sizes_past_the_bound_are_refused() {
    for (field, v) in [
        ("n_routed_experts", 1_000_000_000u64),
        ("hidden_size", 1 << 40),
        ("moe_shared_expert_intermediate_size", u64::MAX),
    ] {
        let ck = Ck::new(LM, SHARD);
        ck.edit_json("config.json", |c| c[field] = json!(v));
        mentions(&ck.refused(), &[field, &v.to_string(), "exceeds"]);
    }
}

#[test]
fn pattern_and_num_layers_disagree() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("config.json", |v| v["num_hidden_layers"] = json!(7));
    mentions(&ck.refused(), &["num_hidden_layers", "7", "6 layers"]);
}

#[test]
fn unknown_layer_letter() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("config.json", |v| {
        v["hybrid_override_pattern"] = json!("ME*MXE")
    });
    mentions(
        &ck.refused(),
        &["hybrid_override_pattern", "'X'", "position 4"],
    );
}

#[test]
fn heads_not_divisible_by_kv_heads() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("config.json", |v| v["num_key_value_heads"] = json!(4));
    mentions(&ck.refused(), &["num_key_value_heads", "6", "4"]);
}

#[test]
fn config_json_not_json() {
    let ck = Ck::new(LM, SHARD);
    std::fs::write(ck.path().join("config.json"), "{\"vocab_size\": 12,").unwrap();
    mentions(&ck.refused(), &["config.json", "JSON"]);
}

#[test]
fn nan_global_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = "lm_head.weight_scale_2";
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().bytes = f32::NAN.to_le_bytes().to_vec()
    });
    mentions(&ck.refused(), &[name, "NaN"]);
}

#[test]
fn negative_global_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.1.mixer.experts.3.down_proj.weight_scale_2";
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().bytes = (-0.01f32).to_le_bytes().to_vec()
    });
    mentions(&ck.refused(), &[name, "-0.01"]);
}

#[test]
fn zero_fp8_input_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = format!("{IN_PROJ}.input_scale");
    ck.edit_shard(&name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().bytes = 0f32.to_le_bytes().to_vec()
    });
    mentions(&ck.refused(), &[&name, "> 0"]);
}

#[test]
fn nan_block_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.5.mixer.shared_experts.up_proj.weight_scale"; // [48, 4]
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().bytes[4 * 7 + 2] = 0x7F
    });
    mentions(&ck.refused(), &[name, "row 7, block 2", "0x7f"]);
}

/// Mutation shard 5/6, `b != 0x80` as `==` in `materialize`: a negative block scale (E4M3
/// 0xB8 = −1.0) is refused, and −0 (0x80, a zero scale with its sign bit) loads.
#[test]
fn negative_block_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.5.mixer.shared_experts.up_proj.weight_scale"; // [48, 4]
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().bytes[4 * 3 + 1] = 0xB8
    });
    mentions(&ck.refused(), &[name, "row 3, block 1", "0xb8"]);
}

#[test]
fn negative_zero_block_scale_loads() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.5.mixer.shared_experts.up_proj.weight_scale";
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().bytes[4 * 3 + 1] = 0x80
    });
    Checkpoint::load(ck.path()).expect("a -0 block scale is a zero scale");
}

#[test]
fn w4a4_without_input_scale() {
    let ck = Ck::new(SynthRecipe::NanoNvfp4, SHARD);
    let name = "backbone.layers.1.mixer.experts.2.up_proj.input_scale";
    ck.drop_tensor(name);
    mentions(&ck.refused(), &[name, "missing"]);
}

#[test]
fn k_scale_without_v_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.2.mixer.v_proj.v_scale";
    ck.drop_tensor(name);
    mentions(&ck.refused(), &[name, "k_scale"]);
}

#[test]
fn odd_offsets_still_load_with_identical_values() {
    let aligned = Ck::new(LM, 0);
    let odd = tempfile::tempdir().unwrap();
    let opts = SynthOptions {
        recipe: LM,
        seed: 11,
        max_shard_bytes: 0,
        misalign: true,
    };
    write_checkpoint(odd.path(), &Geometry::tiny(), &opts).unwrap();
    // Every tensor starts at an odd file offset.
    let b = std::fs::read(odd.path().join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    for (name, info) in h
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
    {
        let start = 8 + n + info["data_offsets"][0].as_u64().unwrap() as usize;
        assert_eq!(start % 2, 1, "{name} starts at {start}");
    }
    let a = Checkpoint::load(aligned.path()).unwrap();
    let o = Checkpoint::load(odd.path()).unwrap();
    assert_eq!(a.weights, o.weights);
    assert_eq!(a.report.host_bytes, o.report.host_bytes);
}

#[test]
fn new_list_spelling_and_head_dim_alias_load() {
    let ck = Ck::new(SynthRecipe::Bf16, SHARD);
    ck.edit_json("config.json", |v| {
        let m = v.as_object_mut().unwrap();
        m.remove("hybrid_override_pattern");
        m.insert(
            "layers_block_type".into(),
            json!([
                "linear_attention",
                "moe",
                "full_attention",
                "linear_attention",
                "mlp",
                "moe"
            ]),
        );
        let hd = m.remove("head_dim").unwrap();
        m.insert("attention_head_dim".into(), hd);
        m.remove("mtp_layers_block_type");
        m.insert("mtp_hybrid_override_pattern".into(), json!("*E"));
    });
    let c = Checkpoint::load(ck.path()).unwrap();
    assert_eq!(c.config.pattern(), "ME*M-E");
    assert_eq!(c.config.attention.as_ref().unwrap().head_dim, 16);
}

#[test]
fn python_infinity_in_config_is_read() {
    // transformers writes `"time_step_limit": [0.0, Infinity]` (Python's json); a clamp-free
    // limit loads, a positive lower limit is refused by name.
    let ck = Ck::new(SynthRecipe::Bf16, SHARD);
    let p = ck.path().join("config.json");
    let text = std::fs::read_to_string(&p).unwrap().replacen(
        "{",
        "{\n  \"time_step_limit\": [0.0, Infinity],",
        1,
    );
    std::fs::write(&p, &text).unwrap();
    Checkpoint::load(ck.path()).unwrap();
    std::fs::write(&p, text.replace("[0.0, Infinity]", "[0.001, Infinity]")).unwrap();
    mentions(&ck.refused(), &["time_step_limit", "no dt clamp"]);
}

/// `delete match arm (false, true)` in `check_kv_pairs` (RELIABILITY §3, shard 3/6): a v_scale
/// shipped without its k_scale is refused naming the missing k_scale.
#[test]
fn v_scale_without_k_scale() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.2.mixer.k_proj.k_scale";
    ck.drop_tensor(name);
    mentions(&ck.refused(), &[name, "v_scale"]);
}

/// `&& → ||` in `Spec::shape_matches` (shard 3/6): a scalar shipped as two values is refused.
#[test]
fn scalar_shipped_as_two_values() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.2.mixer.k_proj.k_scale";
    ck.edit_shard(name, |ts| {
        let t = ts.iter_mut().find(|t| t.name == name).unwrap();
        t.shape = vec![2];
        t.bytes = [t.bytes.clone(), t.bytes.clone()].concat();
    });
    mentions(&ck.refused(), &[name, "[2]"]);
}

/// `Spec::is_scalar → true` (shard 3/6): a vector shipped as one value (`[1]`, the form a
/// scalar may take) is refused.
#[test]
fn vector_shipped_as_one_value() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.0.norm.weight";
    ck.edit_shard(name, |ts| {
        let t = ts.iter_mut().find(|t| t.name == name).unwrap();
        let per = t.bytes.len() / t.shape.iter().product::<usize>();
        t.shape = vec![1];
        t.bytes.truncate(per);
    });
    mentions(&ck.refused(), &[name, "[1]"]);
}

/// `> → >=` in `read_index` (shard 3/6): an index of exactly the largest size loads, one byte
/// more is refused by size.
#[test]
fn an_index_of_exactly_the_size_bound_loads() {
    let max = nemotron_loader::shards::MAX_INDEX_BYTES as usize;
    let ck = Ck::new(LM, SHARD);
    let p = ck.path().join("model.safetensors.index.json");
    let mut text = std::fs::read_to_string(&p).unwrap();
    text.push_str(&" ".repeat(max - text.len()));
    std::fs::write(&p, &text).unwrap();
    Checkpoint::load(ck.path()).unwrap();
    text.push(' ');
    std::fs::write(&p, &text).unwrap();
    mentions(&ck.refused(), &["model.safetensors.index.json", "MiB"]);
}

/// The index reader's `expecting` (shard 3/6): a `weight_map` of the wrong type is refused
/// saying what it should be.
#[test]
fn a_weight_map_that_is_not_an_object_says_what_it_should_be() {
    let ck = Ck::new(LM, SHARD);
    ck.edit_json("model.safetensors.index.json", |v| {
        v["weight_map"] = json!(5)
    });
    mentions(&ck.refused(), &["object mapping tensor names"]);
}

/// `Spec::is_scalar → false` (found by name, session 16): a scalar shipped as `[1]` (as some
/// exports write it) loads, with its value.
#[test]
fn scalar_shipped_as_one_value_loads() {
    let ck = Ck::new(LM, SHARD);
    let name = "backbone.layers.2.mixer.k_proj.k_scale";
    ck.edit_shard(name, |ts| {
        ts.iter_mut().find(|t| t.name == name).unwrap().shape = vec![1];
    });
    Checkpoint::load(ck.path()).unwrap();
}

/// Mutation shard 5/6, `||` as `&&` in the weight map's shard-name check: a shard name with a
/// backslash, and `..`, are refused as not plain file names (a `/` is refused either way).
#[test]
fn shard_names_with_a_backslash_or_dotdot_are_refused() {
    for bad in ["sub\\model.safetensors", ".."] {
        let ck = Ck::new(LM, SHARD);
        ck.index_set("backbone.norm_f.weight", bad);
        mentions(&ck.refused(), &["plain file name"]);
    }
}
