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

/// The most `top_logprobs` a request may ask for (OpenAI's and vLLM's limit).
pub use nemotron_kernels::MAX_TOP_LOGPROBS;

/// A produced token's log-probability and the `n` most likely tokens' at its position, from the
/// model's own distribution: the raw log-softmax of the logits row, before the repetition
/// penalty, temperature and the filters (what vLLM returns by default).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// `(id, logprob)` by decreasing log-probability, the lower id first on ties; at most the `n`
    /// asked for.
    pub top: Vec<(u32, f32)>,
}

/// [`TokenLogprobs`] of `token` in one row of logits with the `n` most likely tokens (`n` ≤
/// [`MAX_TOP_LOGPROBS`], checked when the request is made). The log-sum-exp is summed in f64.
pub fn logprobs(row: &[f32], token: u32, n: usize) -> TokenLogprobs {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| ((x - m) as f64).exp()).sum();
    let lse = m as f64 + sum.ln();
    let lp = |x: f32| (x as f64 - lse) as f32;
    // The `n` largest by one pass, kept sorted (n ≤ 20).
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &x) in row.iter().enumerate() {
            if top.len() == n && x <= top[n - 1].1 {
                continue;
            }
            let at = top.partition_point(|&(_, y)| y >= x);
            top.insert(at, (i as u32, x));
            top.truncate(n);
        }
    }
    TokenLogprobs {
        token,
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| lp(x)),
        top: top.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a log-softmax written out in f64 and a full sort: the chosen token's value, the
    /// top entries' order (ties by the lower id) and count, on a row with ties and a token that
    /// does not rank.
    #[test]
    fn logprobs_are_the_raw_log_softmax_and_its_top() {
        let row = [0.5f32, 3.0, -1.0, 3.0, 2.0, -7.5, 0.0, 2.0];
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        let want = |i: usize| ((row[i] as f64).exp() / z).ln() as f32;
        for n in [0usize, 1, 3, 8] {
            let got = logprobs(&row, 5, n);
            assert!((got.logprob - want(5)).abs() < 1e-6, "{got:?}");
            let mut ids: Vec<usize> = (0..row.len()).collect();
            ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let expect: Vec<u32> = ids[..n].iter().map(|&i| i as u32).collect();
            let ids_got: Vec<u32> = got.top.iter().map(|t| t.0).collect();
            assert_eq!(ids_got, expect, "n = {n}");
            for &(i, l) in &got.top {
                assert!((l - want(i as usize)).abs() < 1e-6, "{i}: {l}");
            }
        }
        // Large logits: no overflow (the max is taken out first).
        let big = [1000.0f32, 999.0];
        let got = logprobs(&big, 1, 2);
        let want1 = -(1.0f64 + 1f64.exp()).ln() as f32;
        assert!((got.logprob - want1).abs() < 1e-6, "{got:?}");
    }
}
