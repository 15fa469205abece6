//! The control channel's contract: its sending side ([`ControlSend`]), its
//! receiving side ([`ControlRecv`]) and what that receives, and the
//! channel as one value that splits into both ([`ControlChannel`]).

use core::ffi::c_int;
use core::time::Duration;

use super::FaultKind;

/// A received control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming<'b> {
    /// The sender's endpoint, if the channel knows it (empty otherwise). A
    /// coordinator keeps endpoints of at most 128 bytes
    /// (`handshake::NAME_LEN`): a longer one names no one.
    pub from: &'b str,
    /// The local endpoint it arrived at (a coordinator with one endpoint
    /// per role learns the sender's role from it).
    pub via: &'b str,
    /// Who the channel authenticated the sender as (a CURVE channel: the
    /// sender's public key, as ZeroMQ's `User-Id` names it); empty where
    /// the channel authenticates no one. A coordinator binds each
    /// registration to it and takes an instance's later messages only
    /// from the same identity. At most [`NAME_LEN`](crate::handshake::NAME_LEN)
    /// bytes count: a longer one names no one.
    pub user: &'b str,
    /// Frame 0: `__transfer__` for transfer messages.
    pub magic: &'b [u8],
    /// Frame 1: the JSON payload.
    pub payload: &'b [u8],
}

/// What the receiving side of a control channel saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelEvent<'b> {
    /// A message.
    Message(Incoming<'b>),
    /// A peer's connection closed: its process exited or it shut down.
    /// Channels that cannot tell never report it.
    Gone {
        /// The peer's endpoint.
        from: &'b str,
    },
}

/// The sending side of a control channel.
pub trait ControlSend {
    /// Its errors.
    type Error: core::error::Error;

    /// What kind of failure `error` is (a peer gone, a message too large,
    /// ...). A type that is both sides of a channel names the side it
    /// means: `<C as ControlSend>::fault_kind(e)`.
    fn fault_kind(error: &Self::Error) -> FaultKind;

    /// Sends `parts` as one message to the endpoint `to`: all of them, or
    /// none. The protocol's messages are two frames,
    /// `send(to, &[magic, payload])`; an application's own messages on the
    /// protocol's sockets may have any number (sglang's decoder returns its
    /// output to the head as a JSON descriptor frame, then one frame per
    /// tensor). A channel whose wire carries only two frames refuses other
    /// counts with an error.
    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), Self::Error>;
}

/// How long a channel that cannot watch a wake descriptor may block in
/// [`ControlRecv::recv`] when it is given one: short enough that the
/// caller's data plane, polled between receives, loses no more than this.
pub const WAKE_POLL: Duration = Duration::from_micros(100);

/// The receiving side of a control channel.
pub trait ControlRecv {
    /// Its errors.
    type Error: core::error::Error;

    /// What kind of failure `error` is (as [`ControlSend::fault_kind`]).
    fn fault_kind(error: &Self::Error) -> FaultKind;

    /// The endpoint peers send to.
    fn local_endpoint(&self) -> &str;

    /// Receives the next message into `buf`, waiting at most `wait` for one
    /// (zero: do not wait). `Ok(None)`: nothing arrived in time. An error
    /// concerns one message or peer; the channel goes on working.
    ///
    /// `wake`, when given, is a file descriptor (a data plane's
    /// `Transport::wake_fd`) that ends the wait early: the call returns
    /// `Ok(None)` as soon as it is readable, so that one thread waits on
    /// both. A channel that cannot watch a descriptor (one built on a
    /// condition variable, say) waits at most [`WAKE_POLL`] whenever it is
    /// given one instead, so that its caller polls the data plane that
    /// often; one that ignores `wake` delays its caller's completions by
    /// up to `wait`.
    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<c_int>,
    ) -> Result<Option<ChannelEvent<'b>>, Self::Error>;
}

/// A control channel as one value that splits into its sending and
/// receiving side, so that a runtime can block in `recv` on one thread
/// while others send. Any pair `(sender, receiver)` is one already: an
/// embedder implements [`ControlSend`] and [`ControlRecv`] and passes the
/// pair; a backend whose sides are made together (a bound socket) may
/// implement this for the convenience of its callers.
pub trait ControlChannel {
    /// The sending side.
    type Sender: ControlSend + Send;
    /// The receiving side.
    type Receiver: ControlRecv + Send;

    /// Splits the channel.
    fn split(self) -> (Self::Sender, Self::Receiver);
}

impl<S: ControlSend + Send, R: ControlRecv + Send> ControlChannel for (S, R) {
    type Sender = S;
    type Receiver = R;

    fn split(self) -> (S, R) {
        self
    }
}
