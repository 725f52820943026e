#![allow(dead_code)]
//! Shared helpers for the model tests.

use burn::backend::NdArray;
use burn::tensor::Tensor;
use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};

pub type B = NdArray<f32>;

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

pub fn rows<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
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
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// mean |a - b|.
pub fn mean_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
}
