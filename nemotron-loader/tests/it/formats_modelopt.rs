//! Format decoders and encoders against independent goldens: NVFP4 packed by NVIDIA ModelOpt's own
//! `NVFP4QTensor.quantize`, FP8 by ModelOpt's FP8 export, E4M3 / BF16 / F16 by torch's casts
//! (`tools/gen_format_fixtures.py`, run once; this test reads only its small output).
//! Comparisons are bit-exact. The counterfactual tests show that swapped nibbles or an ignored
//! `weight_scale_2` cannot pass the same comparison.

use nemotron_loader::formats::*;
use safetensors::SafeTensors;

fn fixture() -> Vec<u8> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/formats.safetensors"
    );
    std::fs::read(p)
        .unwrap_or_else(|e| panic!("{p}: {e} (generate it with tools/gen_format_fixtures.py)"))
}

struct F<'a>(SafeTensors<'a>);

impl F<'_> {
    fn bytes(&self, name: &str) -> Vec<u8> {
        self.0
            .tensor(name)
            .unwrap_or_else(|_| panic!("fixture lacks {name}"))
            .data()
            .to_vec()
    }
    fn shape(&self, name: &str) -> Vec<usize> {
        self.0.tensor(name).unwrap().shape().to_vec()
    }
    fn f32s(&self, name: &str) -> Vec<f32> {
        let b = self.bytes(name);
        (0..b.len() / 4).map(|i| f32_at(&b, i)).collect()
    }
    fn u16s(&self, name: &str) -> Vec<u16> {
        self.bytes(name)
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }
    fn nvfp4_cases(&self) -> Vec<usize> {
        (0..)
            .take_while(|i| self.0.tensor(&format!("nvfp4.{i}.w")).is_ok())
            .collect()
    }
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Dequantizes a whole NVFP4 matrix with the given row decoder.
fn dequant_with(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    rows: usize,
    cols: usize,
    row: impl Fn(&[u8], &[u8], f32, &mut [f32]),
) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        row(
            &packed[r * cols / 2..(r + 1) * cols / 2],
            &scales[r * cols / 16..(r + 1) * cols / 16],
            gs,
            &mut out[r * cols..(r + 1) * cols],
        );
    }
    out
}

fn mismatches(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| !same_bits(**x, **y))
        .count()
}

#[test]
fn e4m3_decode_all_256_codes_matches_torch() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    let table = f.f32s("e4m3.table");
    assert_eq!(table.len(), 256);
    for (b, want) in table.iter().enumerate() {
        assert!(
            same_bits(e4m3_to_f32(b as u8), *want),
            "code {b:#04x}: {} vs torch {want}",
            e4m3_to_f32(b as u8)
        );
    }
}

#[test]
fn e4m3_encode_matches_torch_cast() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    for set in ["e4m3.enc", "e4m3.sat"] {
        let x = f.f32s(&format!("{set}.x"));
        let code = f.bytes(&format!("{set}.code"));
        let bad: Vec<_> = x
            .iter()
            .zip(&code)
            .filter(|(x, c)| f32_to_e4m3(**x) != **c)
            .take(5)
            .collect();
        assert!(
            bad.is_empty(),
            "{set}: {} of {} differ, e.g. {bad:?}",
            x.iter()
                .zip(&code)
                .filter(|(x, c)| f32_to_e4m3(**x) != **c)
                .count(),
            x.len()
        );
    }
}

#[test]
fn bf16_and_f16_rounding_match_torch() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    let (x, y) = (f.f32s("bf16.x"), f.u16s("bf16.y"));
    for (x, y) in x.iter().zip(&y) {
        assert_eq!(f32_to_bf16_bits(*x), *y, "bf16({x:e})");
    }
    let (x, y) = (f.f32s("f16.x"), f.u16s("f16.y"));
    for (x, y) in x.iter().zip(&y) {
        assert_eq!(f32_to_f16_bits(*x), *y, "f16({x:e})");
    }
}

#[test]
fn nvfp4_encoder_reproduces_modelopt_bytes() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    let cases = f.nvfp4_cases();
    assert!(cases.len() >= 6, "fixture has {} NVFP4 cases", cases.len());
    for i in cases {
        let p = |s: &str| format!("nvfp4.{i}.{s}");
        let shape = f.shape(&p("w"));
        let (rows, cols) = (shape[0], shape[1]);
        let enc = nvfp4_encode(&f.f32s(&p("w")), rows, cols);
        assert_eq!(
            enc.weight_scale_2.to_bits(),
            f.f32s(&p("weight_scale_2"))[0].to_bits(),
            "case {i}: weight_scale_2"
        );
        assert_eq!(
            enc.block_scales,
            f.bytes(&p("weight_scale")),
            "case {i}: block scales"
        );
        assert_eq!(enc.packed, f.bytes(&p("weight")), "case {i}: packed codes");
    }
}

#[test]
fn nvfp4_dequant_matches_the_format_definition_bit_exactly() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    for i in f.nvfp4_cases() {
        let p = |s: &str| format!("nvfp4.{i}.{s}");
        let shape = f.shape(&p("w"));
        let got = dequant_with(
            &f.bytes(&p("weight")),
            &f.bytes(&p("weight_scale")),
            f.f32s(&p("weight_scale_2"))[0],
            shape[0],
            shape[1],
            nvfp4_dequant_row,
        );
        assert_eq!(mismatches(&got, &f.f32s(&p("dequant"))), 0, "case {i}");
    }
}

/// A decoder that reads the high nibble as the even column must not pass.
#[test]
fn counterfactual_swapped_nibbles_is_caught() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    let swapped = |packed: &[u8], scales: &[u8], gs: f32, out: &mut [f32]| {
        let p: Vec<u8> = packed.iter().map(|b| b.rotate_left(4)).collect();
        nvfp4_dequant_row(&p, scales, gs, out)
    };
    let shape = f.shape("nvfp4.0.w");
    let got = dequant_with(
        &f.bytes("nvfp4.0.weight"),
        &f.bytes("nvfp4.0.weight_scale"),
        f.f32s("nvfp4.0.weight_scale_2")[0],
        shape[0],
        shape[1],
        swapped,
    );
    let n = mismatches(&got, &f.f32s("nvfp4.0.dequant"));
    assert!(
        n > got.len() / 2,
        "swapped nibbles differ in only {n} of {} elements",
        got.len()
    );
}

/// A decoder that ignores the global scale must not pass.
#[test]
fn counterfactual_ignored_global_scale_is_caught() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    let shape = f.shape("nvfp4.0.w");
    let got = dequant_with(
        &f.bytes("nvfp4.0.weight"),
        &f.bytes("nvfp4.0.weight_scale"),
        1.0,
        shape[0],
        shape[1],
        nvfp4_dequant_row,
    );
    let want = f.f32s("nvfp4.0.dequant");
    let nonzero = want.iter().filter(|v| **v != 0.0).count();
    assert_eq!(
        mismatches(&got, &want),
        nonzero,
        "every non-zero element must differ"
    );
}

#[test]
fn fp8_encoder_and_dequant_match_modelopt() {
    let buf = fixture();
    let f = F(SafeTensors::deserialize(&buf).unwrap());
    let (q, scale) = fp8_encode(&f.f32s("fp8.0.w"));
    assert_eq!(
        scale.to_bits(),
        f.f32s("fp8.0.weight_scale")[0].to_bits(),
        "weight_scale"
    );
    assert_eq!(q, f.bytes("fp8.0.weight"), "E4M3 codes");
    let cols = f.shape("fp8.0.w")[1];
    let want = f.f32s("fp8.0.dequant");
    let mut got = vec![0f32; want.len()];
    for (r, row) in got.chunks_mut(cols).enumerate() {
        fp8_dequant_row(&q[r * cols..(r + 1) * cols], scale, row);
    }
    assert_eq!(mismatches(&got, &want), 0);
}
