//! A coordinator, an encoder, two denoisers and a decoder as separate OS
//! processes on ferry's shared-memory loopback, moving 64 requests of
//! realistic tensors (prompt embeddings [1, 512, 4096] bf16, latents
//! [1, 16, 21, 90, 160] bf16, scalar fields with the prompt and sampling
//! parameters). Each denoiser checks and transforms what it receives; the
//! decoder checks every byte. Prints a summary table and exits non-zero on
//! any mismatch, leak or failure.
//!
//! `cargo run --release --example pipeline [-- --requests N --denoisers D]`

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tensorferry_cli::pipeline::main(tensorferry_cli::pipeline::PipelineArgs::parse(), &[])
}
