//! tensorferry-zmq: tensorferry-core's `ControlChannel` over ZeroMQ, with sglang's
//! socket layout and framing.
//!
//! Every process binds PULL sockets where it receives (an instance: its
//! work endpoint; the coordinator: one result endpoint per role) and
//! connects a PUSH socket to each endpoint it sends to, on first use.
//! Transfer messages are `[b"__transfer__", json]`; other messages share
//! the sockets and are handed to the caller untouched.
//!
//! A PULL socket cannot say who sent a message, so [`Incoming::from`] is
//! empty and [`Incoming::via`] names the local endpoint it arrived at (the
//! coordinator learns the sender's role from it). Each PUSH socket is
//! monitored: when its peer's connection drops (the process died or
//! restarted), the receiving side reports the peer [`ChannelEvent::Gone`],
//! and ZeroMQ reconnects by itself when the peer comes back.
//!
//! [`Incoming::from`]: tensorferry_core::transport::Incoming::from
//! [`Incoming::via`]: tensorferry_core::transport::Incoming::via
//! [`ChannelEvent::Gone`]: tensorferry_core::transport::ChannelEvent::Gone
//!
//! Queues are bounded on purpose (high-water marks), a send that finds the
//! queue full fails after a short timeout instead of blocking the caller,
//! and closing lingers so that queued messages still go out.
//!
//! Who may connect is a [`Guard`]: an allow-list of addresses and, with
//! [`CurveConfig`], CurveZMQ between ferry processes (every bound socket a
//! CURVE server admitting listed keys, every connection a CURVE client),
//! enforced by a ZAP handler per context ([`ZapHandler`]); the verbs data
//! plane's side channel and the transfer engine's notification inbox take
//! the same guard. Keys come from certificate files in czmq's and pyzmq's
//! format ([`CurveConfig::load`], [`write_certificates`]); a guard's
//! settings, given or from the environment a deployment sets once per
//! machine ([`GuardConfig`], [`Guard::from_env`]), are read in one place.
//!
//! Modules: [`ZmqChannel`] binds (`channel`), [`ZmqSender`] connects and
//! sends (`send`), [`ZmqReceiver`] receives and watches peers (`recv`);
//! [`ZmqConfig`] and [`ZmqError`] beside them; the guard (`guard`), its
//! handler (`zap`), keys (`curve`), certificates (`cert`) and the server
//! keys a channel learns (`learn`). [`zmq`] is the safe API over libzmq
//! (built with CURVE by `tensorferry-zmq-sys`) that all of them, and the
//! rest of ferry, use.

mod cert;
mod channel;
mod config;
mod curve;
mod error;
mod guard;
mod guard_config;
mod learn;
mod recv;
mod send;
mod zap;
pub mod zmq;

pub use cert::{read_key_pair, read_public_key, read_public_keys, write_certificates, CertError};
pub use channel::ZmqChannel;
pub use config::ZmqConfig;
pub use curve::{CurveConfig, CurveKeyPair, CurvePublicKey, KeyTextError, KEY_TEXT_LEN};
pub use error::ZmqError;
pub use guard::Guard;
pub use guard_config::{GuardConfig, GuardError, ALLOW_FROM_VAR, CURVE_KEY_VAR, CURVE_PEERS_VAR};
pub use recv::{remove_ipc_file, ZmqReceiver};
pub use send::ZmqSender;

/// The name [`GuardConfig`] had before the configs took one suffix.
#[deprecated(since = "0.1.0", note = "renamed to GuardConfig")]
pub type GuardSettings = GuardConfig;
pub use zap::ZapHandler;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_curve;
