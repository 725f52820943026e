//! `nemotron`: NemotronH inference on Burn — checkpoint loading, the model, and the text layer
//! (tokenizer, chat template, generation defaults, streaming detokenization) a Burn application
//! embeds.
//!
//! Token-level generation, runnable as is (a tiny synthetic checkpoint stands in for a real one):
//!
//! ```
//! use burn::tensor::{DType, Device};
//! use nemotron::loader::synth::{write_checkpoint, Geometry, SynthOptions, SynthRecipe};
//! use nemotron::{GenerateOptions, NemotronH, Sampling};
//!
//! let dir = tempfile::tempdir()?;
//! let opts = SynthOptions { recipe: SynthRecipe::LightningMixed, ..Default::default() };
//! write_checkpoint(dir.path(), &Geometry::tiny(), &opts)?;
//!
//! let device = Device::flex();
//! let model = NemotronH::load_as(dir.path(), &device, DType::F32)?;
//!
//! // Streaming, one sequence.
//! let gen = GenerateOptions { max_new_tokens: 8, ..Default::default() };
//! let mut streamed = vec![];
//! let out = model.generate(&[1, 2, 3], gen.clone(), |tok| streamed.push(tok))?;
//! assert_eq!(out.tokens, streamed);
//!
//! // Or as an iterator.
//! let first: Vec<u32> = model.generator(&[1, 2, 3], gen.clone())?.take(3).collect::<Result<_, _>>()?;
//! assert_eq!(first, out.tokens[..3]);
//!
//! // Several prompts in one batch, seeded sampling.
//! let sampled = GenerateOptions { sampling: Sampling { temperature: 0.8, top_p: 0.9, seed: 7, ..Sampling::greedy() }, ..gen };
//! let outs = model.generate_batch(&[vec![1, 2, 3], vec![9, 8]], sampled, |_seq, _tok| {})?;
//! assert_eq!(outs.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Text in, streamed text out, with the checkpoint's tokenizer and chat template:
//!
//! ```no_run
//! use burn::tensor::{DType, Device};
//! use nemotron::{GenerateOptions, TextModel};
//!
//! let device = Device::flex();
//! let tm = TextModel::load("/models/nemotron-3-nano", &device, DType::F32)?;
//! let prompt = tm.chat_prompt(Some("You are terse."), "Name a prime.", Some(false))?;
//! let opts = tm.default_options(64);
//! let out = tm.generate_text(&prompt, opts, |piece| print!("{piece}"))?;
//! eprintln!("\n{} tokens, stopped by {:?}", out.tokens.len(), out.stop);
//! # Ok::<(), nemotron::Error>(())
//! ```
// Library code takes no panic from data: every unwrap/expect is an error, or allowed where it
// stands with the invariant that makes it safe written beside it.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
pub mod chat;
pub mod error;
pub mod hub;
pub mod synth_text;
pub mod text;
pub mod text_model;

pub use backend::{dtype_name, BackendKind, DType};
pub use chat::{ChatTemplate, Message};
pub use error::Error;
pub use nemotron_kernels as kernels;
pub use nemotron_loader as loader;
pub use nemotron_model as model;
pub use nemotron_model::{GenerateOptions, Generation, NemotronH, Sampling, StopReason};
pub use text::{TokenStream, Tokenizer};
pub use text_model::{GenerationDefaults, TextGeneration, TextModel};
