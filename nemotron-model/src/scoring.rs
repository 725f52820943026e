//! Prompt scoring: each prompt token's log-probability given the tokens before it, from one
//! forward over the prompt — what an evaluation harness asks a server for with `echo` and
//! `max_tokens: 0`.

use crate::generate::host_rows;
use crate::sampling::{logprobs, TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::{ModelError, NemotronH};

/// Rows of logits brought to the host at a time: with a 131K vocabulary, 64 rows are ≈ 34 MB
/// of f32, so a long prompt's logits never sit on the host whole.
const HOST_ROWS: usize = 64;

/// Entry `i` is prompt token `i + 1`'s log-probability given tokens `0..=i`, with the `n` most
/// likely tokens at that position (`n` ≤ [`MAX_TOP_LOGPROBS`]). The values are the raw
/// log-softmax that generated tokens' log-probabilities use ([`crate::sampling::logprobs`]).
/// The first token has no entry: nothing precedes it. One forward over the prompt (less its
/// last token, whose logits nothing reads) from a fresh state; an empty prompt, an `n` past the
/// limit or a token past the vocabulary is refused.
pub fn prompt_logprobs(
    model: &NemotronH,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<TokenLogprobs>, ModelError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(ModelError::Input(format!(
            "logprobs: {n} most likely tokens asked for; at most {MAX_TOP_LOGPROBS}"
        )));
    }
    let Some((_, context)) = prompt.split_last() else {
        return Err(ModelError::Input("the prompt is empty".into()));
    };
    if context.is_empty() {
        return Ok(vec![]);
    }
    let mut state = model.new_state();
    let logits = model.forward(&[context], &mut [&mut state])?;
    let [_, t, v] = logits.dims();
    let rows = logits.reshape([t, v]);
    let mut out = Vec::with_capacity(t);
    for r0 in (0..t).step_by(HOST_ROWS) {
        let r1 = (r0 + HOST_ROWS).min(t);
        let block = host_rows(rows.clone().slice_dim(0, r0..r1));
        for (j, row) in block.chunks(v).enumerate() {
            out.push(logprobs(row, prompt[r0 + j + 1], n));
        }
    }
    Ok(out)
}
