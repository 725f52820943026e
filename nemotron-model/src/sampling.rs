//! Sampling: greedy, temperature, top-k, top-p, min-p and repetition penalty, seeded; applied in
//! HF `generate`'s order.

use crate::error::ModelError;

/// How to pick the next token. `temperature == 0` is greedy (the other knobs are then unused
/// except `repetition_penalty`). Applied in HF `generate`'s order: repetition penalty,
/// temperature, top-k, top-p, min-p.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p ×` the most likely one's (0 = off).
    pub min_p: f32,
    /// HF's CTRL-style penalty on every token already in the prompt or output: positive logits
    /// are divided by it, negative ones multiplied (1 = off).
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self::greedy()
    }
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    /// Checks the knobs are in range; names the one that is not.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad =
            |what: &str, v: f32| Err(ModelError::Input(format!("{what} {v} is out of range")));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", self.repetition_penalty);
        }
        Ok(())
    }
}

/// Picks a token from one row of logits. `history` feeds the repetition penalty.
#[allow(
    clippy::expect_used,
    reason = "filtered_probs always keeps the most likely candidate, so the list is never empty"
)]
pub fn pick(logits: &[f32], s: &Sampling, history: &[u32], rng: &mut u64) -> u32 {
    let mut l = logits.to_vec();
    if s.repetition_penalty != 1.0 {
        let mut seen = vec![false; l.len()];
        for &t in history {
            if let Some(x) = seen.get_mut(t as usize) {
                *x = true;
            }
        }
        for (v, _) in l.iter_mut().zip(&seen).filter(|(_, &s)| s) {
            *v = if *v > 0.0 {
                *v / s.repetition_penalty
            } else {
                *v * s.repetition_penalty
            };
        }
    }
    if s.temperature <= 0.0 {
        return argmax(&l);
    }
    let probs = filtered_probs(&l, s);
    let u = next_unit(rng);
    let mut acc = 0.0;
    for &(id, p) in &probs {
        acc += p;
        if u < acc {
            return id;
        }
    }
    probs.last().expect("at least one candidate").0
}

/// The candidate distribution after temperature, top-k, top-p and min-p: `(id, p)` sorted by
/// decreasing probability, summing to 1.
pub fn filtered_probs(logits: &[f32], s: &Sampling) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    if s.top_k > 0 {
        idx.truncate(s.top_k);
    }
    let m = logits[idx[0] as usize];
    let mut p: Vec<(u32, f32)> = idx
        .iter()
        .map(|&i| (i, ((logits[i as usize] - m) / s.temperature).exp()))
        .collect();
    normalize(&mut p);
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let keep = p
            .iter()
            .position(|&(_, x)| {
                acc += x;
                acc >= s.top_p
            })
            .map_or(p.len(), |k| k + 1);
        p.truncate(keep);
        normalize(&mut p);
    }
    if s.min_p > 0.0 {
        let floor = s.min_p * p[0].1;
        p.retain(|&(_, x)| x >= floor);
        normalize(&mut p);
    }
    p
}

fn normalize(p: &mut [(u32, f32)]) {
    let total: f32 = p.iter().map(|x| x.1).sum();
    p.iter_mut().for_each(|x| x.1 /= total);
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

pub(crate) fn is_plain_greedy(s: &Sampling) -> bool {
    s.temperature <= 0.0 && s.repetition_penalty == 1.0
}
