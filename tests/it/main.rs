//! The root crate's integration tests, one binary (each module was its own binary, each linking
//! Burn, CubeCL, wgpu, CUDA, tokenizers and hf-hub again): the model against HF fixtures and the
//! host reference, the device arms, slots and the engine, generation. `hub` stays a binary of its
//! own (it sets process-wide environment variables, which other tests' threads read), and so does
//! `memory` (the device memory counter is process-wide).

mod common;
mod consistency;
mod decode_graph;
mod device_parity;
mod engine;
mod fold;
mod generation;
mod hf_parity;
mod imports;
mod kv8;
mod loadtest;
mod serve_cli;
mod slots;
mod ssm16;
