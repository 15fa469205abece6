//! Socket monitoring: [`SocketEvent`], and the events a monitor socket
//! carries ([`MonitorEvent`]).

use tensorferry_zmq_sys as sys;

/// What happened to a monitored socket's connections. The values are
/// libzmq's bits: OR them (`SocketEvent::CONNECTED as i32 | ...`) for
/// [`Socket::monitor`](super::Socket::monitor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)] // the C names, as libzmq's manual spells them
pub enum SocketEvent {
    /// A connection was made.
    CONNECTED = sys::ZMQ_EVENT_CONNECTED as u16,
    /// A connect is pending.
    CONNECT_DELAYED = sys::ZMQ_EVENT_CONNECT_DELAYED as u16,
    /// A connect failed, and is tried again after an interval.
    CONNECT_RETRIED = sys::ZMQ_EVENT_CONNECT_RETRIED as u16,
    /// The socket listens on an endpoint.
    LISTENING = sys::ZMQ_EVENT_LISTENING as u16,
    /// A bind failed.
    BIND_FAILED = sys::ZMQ_EVENT_BIND_FAILED as u16,
    /// A connection was accepted.
    ACCEPTED = sys::ZMQ_EVENT_ACCEPTED as u16,
    /// Accepting a connection failed.
    ACCEPT_FAILED = sys::ZMQ_EVENT_ACCEPT_FAILED as u16,
    /// A connection's socket was closed.
    CLOSED = sys::ZMQ_EVENT_CLOSED as u16,
    /// Closing a connection's socket failed.
    CLOSE_FAILED = sys::ZMQ_EVENT_CLOSE_FAILED as u16,
    /// A connection was lost.
    DISCONNECTED = sys::ZMQ_EVENT_DISCONNECTED as u16,
    /// Monitoring stopped.
    MONITOR_STOPPED = sys::ZMQ_EVENT_MONITOR_STOPPED as u16,
    /// A handshake failed, for no reason given.
    HANDSHAKE_FAILED_NO_DETAIL = sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL as u16,
    /// A handshake (and its authentication) succeeded.
    HANDSHAKE_SUCCEEDED = sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED as u16,
    /// A handshake failed on a protocol error.
    HANDSHAKE_FAILED_PROTOCOL = sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL as u16,
    /// A handshake failed authentication (the ZAP handler refused it).
    HANDSHAKE_FAILED_AUTH = sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH as u16,
    /// Every event (only as a mask).
    ALL = sys::ZMQ_EVENT_ALL as u16,
}

/// Every event a monitor reports, for [`SocketEvent::from_raw`].
const EVENTS: [SocketEvent; 15] = [
    SocketEvent::CONNECTED,
    SocketEvent::CONNECT_DELAYED,
    SocketEvent::CONNECT_RETRIED,
    SocketEvent::LISTENING,
    SocketEvent::BIND_FAILED,
    SocketEvent::ACCEPTED,
    SocketEvent::ACCEPT_FAILED,
    SocketEvent::CLOSED,
    SocketEvent::CLOSE_FAILED,
    SocketEvent::DISCONNECTED,
    SocketEvent::MONITOR_STOPPED,
    SocketEvent::HANDSHAKE_FAILED_NO_DETAIL,
    SocketEvent::HANDSHAKE_SUCCEEDED,
    SocketEvent::HANDSHAKE_FAILED_PROTOCOL,
    SocketEvent::HANDSHAKE_FAILED_AUTH,
];

impl SocketEvent {
    /// Its value.
    pub fn to_raw(self) -> u16 {
        self as u16
    }

    /// The event of this value; `None` for a value that names none (a
    /// newer libzmq's, or a mask).
    pub fn from_raw(raw: u16) -> Option<Self> {
        EVENTS.iter().copied().find(|e| e.to_raw() == raw)
    }
}

/// The first frame of a monitor socket's message: which event, and its
/// value (an errno for failures, a file descriptor or an interval for
/// others). The second frame is the endpoint it concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonitorEvent {
    /// The event's value as libzmq sent it (see [`event`](Self::event)).
    pub raw: u16,
    /// Its value.
    pub value: u32,
}

impl MonitorEvent {
    /// The event a monitor's first frame describes: 6 bytes, the event
    /// (16 bits) then its value (32), in the machine's byte order. `None`
    /// for a frame of another length.
    pub fn parse(frame: &[u8]) -> Option<Self> {
        let [a, b, c, d, e, f] = <[u8; 6]>::try_from(frame).ok()?;
        Some(Self {
            raw: u16::from_ne_bytes([a, b]),
            value: u32::from_ne_bytes([c, d, e, f]),
        })
    }

    /// The event, if it is one this binding names.
    pub fn event(&self) -> Option<SocketEvent> {
        SocketEvent::from_raw(self.raw)
    }
}
