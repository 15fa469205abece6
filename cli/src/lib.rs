//! What the `ferry` command is made of, apart from its argument parsing:
//! the pipeline example's processes and launcher ([`pipeline`]), their
//! metrics endpoint and probes ([`metrics_http`]), their lifetime by
//! signal ([`lifetime`]) and the text views of wire messages
//! ([`wire_text`]). The library to embed is
//! the `ferry` crate; this one is an application of it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod devices;
pub mod lifetime;
pub mod metrics_http;
pub mod pipeline;
pub mod wire_text;
