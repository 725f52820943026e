//! The merge of every fused and unfused decode form: the chunks' softmax partials of a
//! `(row, q head)` rescaled to its maximum (flash-decoding).

use cubecl::prelude::*;

/// Chunk partials the merge reads per round (loads issued before use: a round costs one
/// memory latency, where a serial walk cost one per chunk — ≈ 40 µs per layer after an 8K prompt).
const MERGE_UNROLL: usize = 8;

/// Merges a `(row, q head)`'s chunk partials: `M = max m_c`, `Z = Σ z_c · e^(m_c − M)`,
/// `o[d] = Σ o_c[d] · e^(m_c − M) / Z` (pad rows write zeros). A cube per `(q head, row)`, a unit
/// per `d`; chunks taken `MERGE_UNROLL` at a time.
#[cube(launch)]
pub fn attn_merge_kernel<F: Float>(
    part: &[f32],
    lens: &[i32],
    slots: &[i32],
    o: &mut [F],
    heads: u32,
    head_dim: u32,
    chunks: u32,
    #[comptime] chunk: usize,
) {
    let (nh, hd, chunks) = (heads as usize, head_dim as usize, chunks as usize);
    // Rows folded over y and z (past 65,535 rows).
    let b = (CUBE_POS_Y + CUBE_POS_Z * CUBE_COUNT_Y) as usize;
    if b >= slots.len() {
        terminate!();
    }
    let h = CUBE_POS_X as usize;
    let dd = UNIT_POS_X as usize;
    if dd >= hd {
        terminate!();
    }
    let oi = (b * nh + h) * hd + dd;
    let slot = slots[b];
    if slot < 0 {
        o[oi] = F::cast_from(0.0f32);
        terminate!();
    }
    let n = lens[slot as usize] as usize + 1;
    let used = n.div_ceil(chunk);
    let stride = hd + 2;
    let base = (b * nh + h) * chunks * stride;
    // Chunk 0 always holds a position; rounds clamp to the last used chunk (a repeat changes
    // neither the maximum nor, masked, the sums).
    let mut mm = part[base];
    let mut c0 = 0usize;
    while c0 < used {
        let mut ms = Array::<f32>::new(MERGE_UNROLL);
        #[unroll]
        for i in 0..MERGE_UNROLL {
            ms[i] = part[base + (c0 + i).min(used - 1) * stride];
        }
        #[unroll]
        for i in 0..MERGE_UNROLL {
            mm = mm.max(ms[i]);
        }
        c0 += MERGE_UNROLL;
    }
    let mut z = 0.0f32;
    let mut acc = 0.0f32;
    c0 = 0usize;
    while c0 < used {
        let mut ms = Array::<f32>::new(MERGE_UNROLL);
        let mut zs = Array::<f32>::new(MERGE_UNROLL);
        let mut os = Array::<f32>::new(MERGE_UNROLL);
        #[unroll]
        for i in 0..MERGE_UNROLL {
            let pb = base + (c0 + i).min(used - 1) * stride;
            ms[i] = part[pb];
            zs[i] = part[pb + 1];
            os[i] = part[pb + 2 + dd];
        }
        #[unroll]
        for i in 0..MERGE_UNROLL {
            let f = if c0 + i < used {
                (ms[i] - mm).exp()
            } else {
                0.0f32
            };
            z += zs[i] * f;
            acc += os[i] * f;
        }
        c0 += MERGE_UNROLL;
    }
    o[oi] = F::cast_from(acc / z);
}
