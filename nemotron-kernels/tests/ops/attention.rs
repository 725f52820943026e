//! Prefill attention (`ops::attention_prefill`, the flash kernel on device arms) against the host
//! reference: GQA ratios 1, 4 and 16, ragged chunk lengths (one empty), chunks over a cached
//! prefix, length 1, a fused `q | k | v` row read in place, key counts that are not a multiple of
//! the kernel's tile, and the rows past each chunk's length exactly zero.

use super::{close, host, Arm, Rng};
use nemotron_kernels::ops;

/// One case: `(nh, kvh, hd, t, cap, extra q columns, [(slot, past, len)])`.
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    &'static [(usize, usize, usize)],
);

/// [`attention_prefill_matches`] with `flashmma=on`: the tensor-core kernel on a CUDA bf16 arm
/// for the cases it takes (heads a multiple of 16, query rows of 8-wide vectors; the others run
/// the SIMT kernel and are counted as fallbacks), elsewhere the SIMT kernel for every case, each
/// counted as a launch the setting could not take. Process-wide setting (the default, held under
/// the attention settings' lock).
pub fn attention_prefill_mma_matches(arm: &Arm) {
    use nemotron_kernels::cube::plans::attention::{
        flash_mma_fallbacks, flash_mma_launches, set_flash_mma,
    };
    let _lock = super::ATTN_FORM.lock().unwrap_or_else(|e| e.into_inner());
    let (fell0, ran0) = (flash_mma_fallbacks(), flash_mma_launches());
    set_flash_mma(true);
    let r = std::panic::catch_unwind(|| prefill_cases(arm));
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    let (fell, ran) = (flash_mma_fallbacks() - fell0, flash_mma_launches() - ran0);
    let tensor_cores =
        arm.dtype == burn::tensor::DType::BF16 && nemotron_kernels::cube::bf16_mma(&arm.dev);
    eprintln!(
        "{:?}: {ran} tensor-core launches, {fell} fallbacks",
        arm.dtype
    );
    if tensor_cores {
        assert!(ran > 0, "flashmma=on never reached the tensor-core kernel");
    } else {
        assert!(
            ran == 0 && fell > 0,
            "{ran} tensor-core launches, {fell} fallbacks"
        );
    }
}

/// The SIMT kernel on every arm (`flashmma=off` for the call: bf16 on CUDA would otherwise take
/// the tensor-core kernel, the default, which [`attention_prefill_mma_matches`] checks).
pub fn attention_prefill_matches(arm: &Arm) {
    use nemotron_kernels::cube::plans::attention::set_flash_mma;
    let _lock = super::ATTN_FORM.lock().unwrap_or_else(|e| e.into_inner());
    set_flash_mma(false);
    let r = std::panic::catch_unwind(|| prefill_cases(arm));
    set_flash_mma(true);
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

fn prefill_cases(arm: &Arm) {
    let cases: [Case; 6] = [
        // Lightning's heads (16:1), fresh ragged sequences.
        (32, 2, 128, 40, 64, 0, &[(1, 0, 40), (0, 0, 17)]),
        // 4:1 over cached prefixes, a fused row (k and v columns after q), an empty chunk.
        (
            8,
            2,
            64,
            37,
            100,
            4 * 64,
            &[(0, 50, 37), (2, 3, 1), (1, 0, 0)],
        ),
        // 1:1, many key tiles and 32 positions per row tile.
        (4, 4, 16, 70, 80, 0, &[(0, 5, 70)]),
        // One token, the smallest head.
        (2, 1, 8, 1, 4, 0, &[(0, 0, 1)]),
        // A chunk after a prefix that ends inside a key tile, 16:1.
        (32, 2, 128, 45, 200, 0, &[(1, 100, 45), (0, 33, 20)]),
        // One query head, a long sequence.
        (1, 1, 128, 150, 160, 0, &[(0, 0, 150)]),
    ];
    for (nh, kvh, hd, t, cap, extra, seqs) in cases {
        let mut rng = Rng::new(29, arm);
        let (b, s) = (seqs.len(), seqs.iter().map(|x| x.0).max().unwrap() + 1);
        let w = nh * hd + extra;
        let q = rng.vec(b * t * w, 1.0);
        let kp = rng.vec(s * kvh * cap * hd, 1.0);
        let vp = rng.vec(s * kvh * cap * hd, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let slots: Vec<usize> = seqs.iter().map(|x| x.0).collect();
        let past: Vec<usize> = seqs.iter().map(|x| x.1).collect();
        let lens: Vec<usize> = seqs.iter().map(|x| x.2).collect();
        let run = |a: &Arm| {
            host(ops::attention_prefill(
                a.t(&q, [b, t, w]),
                a.t(&kp, [s, kvh, cap, hd]),
                a.t(&vp, [s, kvh, cap, hd]),
                &slots,
                &past,
                &lens,
                nh,
                scale,
            ))
        };
        let (got, want) = (run(arm), run(&Arm::host()));
        let tag = format!("attention_prefill ({nh}:{kvh} heads of {hd}, T {t}, seqs {seqs:?})");
        close(&tag, &got, &want, arm.band.lin);
        for (r, &len) in lens.iter().enumerate() {
            let past_len = &got[(r * t + len) * nh * hd..(r + 1) * t * nh * hd];
            assert!(
                past_len.iter().all(|&v| v == 0.0),
                "{tag}: row {r}'s positions past its length {len} are not zero"
            );
        }
    }
}
