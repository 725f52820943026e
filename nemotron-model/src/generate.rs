//! Greedy and seeded sampling generation.

use crate::error::ModelError;
use crate::model::NemotronH;
use burn::tensor::Tensor;
use nemotron_kernels::NemotronBackend;

/// How to pick the next token. `temperature == 0` is greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    pub seed: u64,
    /// Stop after emitting any of these.
    pub stop_ids: Vec<u32>,
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            stop_ids: vec![],
        }
    }
}

/// Picks a token from one row of logits.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut u64) -> u32 {
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if s.top_k > 0 {
        idx.truncate(s.top_k);
    }
    let m = logits[idx[0]];
    let mut p: Vec<f32> = idx
        .iter()
        .map(|&i| ((logits[i] - m) / s.temperature).exp())
        .collect();
    let total: f32 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let keep = p.iter().position(|&x| {
            acc += x;
            acc >= s.top_p
        });
        let keep = keep.map_or(p.len(), |k| k + 1);
        p.truncate(keep);
        let total: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= total);
    }
    let u = next_unit(rng);
    let mut acc = 0.0;
    for (j, &x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return idx[j] as u32;
        }
    }
    idx[p.len() - 1] as u32
}

/// Index of the largest value (the first on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn next_unit(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

impl<B: NemotronBackend> NemotronH<B> {
    /// Generates up to `max_new` tokens after `prompt`, calling `on_token` for each as it is
    /// produced. Only the sampled ids leave the model each step.
    pub fn generate(
        &self,
        prompt: &[u32],
        max_new: usize,
        s: &Sampling,
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Input("the prompt is empty".into()));
        }
        let mut state = self.new_state();
        let mut rng = s.seed;
        let mut out = Vec::with_capacity(max_new);
        let mut next: Vec<u32> = prompt.to_vec();
        for _ in 0..max_new {
            let logits = self.forward_one(&next, &mut state)?;
            let last = last_row(logits);
            let tok = pick(&last, s, &mut rng);
            out.push(tok);
            on_token(tok);
            if s.stop_ids.contains(&tok) {
                break;
            }
            next = vec![tok];
        }
        Ok(out)
    }
}

/// The last row of `[T, V]` logits on the host.
pub fn last_row<B: NemotronBackend>(logits: Tensor<B, 2>) -> Vec<f32> {
    let [t, _] = logits.dims();
    logits
        .slice_dim(0, t - 1..t)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 logits")
}
