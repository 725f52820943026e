//! Prompt scoring: each prompt token's log-probability given the tokens before it, from one
//! forward over the prompt — what an evaluation harness asks a server for with `echo` and
//! `max_tokens: 0`.

use crate::generate::device_logprobs;
use crate::sampling::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::{ModelError, NemotronH};

/// Entry `i` is prompt token `i + 1`'s log-probability given tokens `0..=i`, with the `n` most
/// likely tokens at that position (`n` ≤ [`MAX_TOP_LOGPROBS`]). The values are the raw
/// log-softmax that generated tokens' log-probabilities use, computed on the device over every
/// position in one launch ([`device_logprobs`]): `2 + 2n` numbers a position come back, not its
/// logits row.
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
    let vocab = model.config().vocab_size;
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Input(format!(
            "prompt token {bad} is past the vocabulary of {vocab}"
        )));
    }
    let mut state = model.new_state();
    let logits = model.forward(&[context], &mut [&mut state])?;
    let [_, t, v] = logits.dims();
    Ok(device_logprobs(
        logits.reshape([t, v]),
        &prompt[1..=t],
        &vec![n; t],
    ))
}
