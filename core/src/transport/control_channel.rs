//! The control channel's contract: its sending side ([`ControlSend`]), its
//! receiving side ([`ControlRecv`]) and what that receives, and the
//! channel as one value that splits into both ([`ControlChannel`]).

use core::time::Duration;

use super::Fault;

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
    type Error: Fault;

    /// Sends `parts` as one message to the endpoint `to`: all of them, or
    /// none. The protocol's messages are two frames,
    /// `send(to, &[magic, payload])`; an application's own messages on the
    /// protocol's sockets may have any number (sglang's decoder returns its
    /// output to the head as a JSON descriptor frame, then one frame per
    /// tensor). A channel whose wire carries only two frames refuses other
    /// counts with an error.
    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), Self::Error>;
}

/// The receiving side of a control channel.
pub trait ControlRecv {
    /// Its errors.
    type Error: Fault;

    /// The endpoint peers send to.
    fn local_endpoint(&self) -> &str;

    /// Receives the next message into `buf`, waiting at most `wait` for one
    /// (zero: do not wait). `Ok(None)`: nothing arrived in time. An error
    /// concerns one message or peer; the channel goes on working.
    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
    ) -> Result<Option<ChannelEvent<'b>>, Self::Error>;

    /// True if [`recv_or_wake`](Self::recv_or_wake) wakes on its
    /// descriptor (the default: it does not).
    #[cfg(feature = "std")]
    fn can_wake(&self) -> bool {
        false
    }

    /// Like [`recv`](Self::recv), and also returns `Ok(None)` as soon as
    /// `wake` (a data plane's
    /// [`Transport::wake_fd`](super::Transport::wake_fd)) is readable, so
    /// that one thread waits on both. Channels whose
    /// [`can_wake`](Self::can_wake) is false wait as `recv` does (the
    /// default), and their callers must bound `wait`.
    #[cfg(feature = "std")]
    fn recv_or_wake<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: std::os::fd::RawFd,
    ) -> Result<Option<ChannelEvent<'b>>, Self::Error> {
        let _ = wake;
        self.recv(buf, wait)
    }
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
