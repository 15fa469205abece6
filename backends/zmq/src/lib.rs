//! ferry-zmq: ferry-core's `ControlChannel` over ZeroMQ, with sglang's
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
//! [`Incoming::from`]: ferry_core::transport::Incoming::from
//! [`Incoming::via`]: ferry_core::transport::Incoming::via
//! [`ChannelEvent::Gone`]: ferry_core::transport::ChannelEvent::Gone
//!
//! Queues are bounded on purpose (high-water marks), a send that finds the
//! queue full fails after a short timeout instead of blocking the caller,
//! and closing lingers so that queued messages still go out.
//!
//! Modules: [`ZmqChannel`] binds (`channel`), [`ZmqSender`] connects and
//! sends (`send`), [`ZmqReceiver`] receives and watches peers (`recv`);
//! [`ZmqConfig`] and [`ZmqError`] beside them.

mod channel;
mod config;
mod error;
mod recv;
mod send;
mod zap;

pub use channel::ZmqChannel;
pub use config::ZmqConfig;
pub use error::ZmqError;
pub use recv::{remove_ipc_file, ZmqReceiver};
pub use send::ZmqSender;

#[cfg(test)]
mod tests;
