//! One launcher for both weight formats: the path [`super::plan`] gives, run tier by tier in one
//! order — the decoded path (where cubek refuses it, the plan without it), the tensor cores
//! (where a planned launch cannot be made, the vector GEMV), then the format's GEMVs. A format
//! says only what each tier runs ([`Weights`]: NVFP4 in [`super::nvfp4`], FP8 in [`super::fp8`]).

use super::plan::{Format, LinearPath};
use super::Call;
use crate::{Epilogue, Rows};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};

/// What one weight format runs at each tier.
pub(crate) trait Weights<R: CubeRuntime>: Sized {
    /// The format, as the plan sees it.
    const FORMAT: Format;
    /// Matrices in the stack.
    fn experts(&self) -> usize;
    /// Outputs of each matrix.
    fn out_features(&self) -> usize;
    /// Whether the split kernels take rows of `k` inputs (else a split output is sliced from the
    /// whole one).
    fn splits(&self, k: usize) -> bool;
    /// The decoded path ([`super::decoded`]); `Err` where cubek refuses it.
    fn decoded(&self, c: &Call<R>) -> Result<(), String>;
    /// The tensor-core path `path`; `false` where the launch cannot be made.
    fn tensor_cores(&self, c: &Call<R>, path: LinearPath) -> bool;
    /// A GEMV path (small-M, vector, expert-major, scalar).
    fn gemv(&self, c: &Call<R>, path: LinearPath);
}

/// Runs `c` on the path the plan gives, tier by tier (see the module docs).
pub(crate) fn run<R: CubeRuntime, W: Weights<R>>(c: &Call<R>, w: &W) {
    let mut path = c.plan(W::FORMAT, w.experts()).path;
    if path == LinearPath::Decoded {
        match w.decoded(c) {
            Ok(()) => return,
            Err(e) => {
                let what = match W::FORMAT {
                    Format::Nvfp4 => "NVFP4 decoded-weight",
                    Format::Fp8 => "FP8 decoded-weight",
                };
                crate::cube::matmul::tiled_refused(what, &e);
                path = c.plan_without_decoded(W::FORMAT, w.experts()).path;
            }
        }
    }
    if matches!(
        path,
        LinearPath::Tiled { .. } | LinearPath::Mma(_) | LinearPath::Gemm
    ) {
        if w.tensor_cores(c, path) {
            return;
        }
        // A planned launch that could not be made (a routed call without expert ids).
        path = LinearPath::Gemv;
    }
    w.gemv(c, path);
}

/// `epi(x · Wᵀ)` for `x [R, in]`, or per routed slot ([`Rows`]).
pub(crate) fn launch<R: CubeRuntime, W: Weights<R>>(
    x: CubeTensor<R>,
    w: W,
    rows: Rows<CubeBackend<R>>,
    epi: Epilogue,
) -> CubeTensor<R> {
    let c = Call::new(x, rows, w.out_features(), epi);
    run(&c, &w);
    c.y
}

/// A plain linear into three output tensors of `widths` columns: the kernels write the parts
/// directly where the format's split kernels take the rows, else the whole output is sliced.
pub(crate) fn launch3<R: CubeRuntime, W: Weights<R>>(
    x: CubeTensor<R>,
    w: W,
    widths: [usize; 3],
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    if !w.splits(x.meta.shape()[1]) {
        return Call::slice3(launch(x, w, Rows::Each, Epilogue::None), widths);
    }
    let c = Call::new3(x, widths);
    run(&c, &w);
    (c.y, c.y1, c.y2)
}
