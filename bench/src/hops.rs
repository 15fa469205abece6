//! The floor of a hand-off over Unix sockets: each control message on its
//! path sent alone, as the same bytes, between two threads over a bare
//! Unix datagram socket pair (the kernel path of the runtime's
//! `SOCK_SEQPACKET` sockets), with no runtime around it.
//!
//! A hand-off on the fast path (the receiver's slot set aside) is four
//! messages one after the other before the receiver holds the data:
//! `transfer_staged` (sender → coordinator), `transfer_push` (coordinator →
//! sender), `transfer_pushed` (sender → coordinator, after the write) and
//! `transfer_ready` (coordinator → receiver); the protocol has no shorter
//! path, since the coordinator picks the slot and tells the receiver. Each
//! is timed here as half of a round trip (this thread sends it, an echo
//! thread sends it back), and the hops' sum is what the four cost with
//! nothing else in the way.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorferry_core::json::{JsonStr, RawJson};
use tensorferry_core::wire::{
    Manifest, Msg, Push, Pushed, Ready, Shape, Staged, TensorEntry, TRANSFER_MAGIC,
};

/// The fast path's messages, in order, as they go on the wire: the Unix
/// socket channel's packet (kind, magic's length, magic, payload) for a
/// hand-off of one `size`-byte tensor between shared-memory pools.
pub fn fast_path(size: u64) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    let dims = [size];
    let tensor = [TensorEntry {
        field: JsonStr::plain("blob"),
        list_index: None,
        offset: 0,
        shape: Shape::Dims(&dims),
        dtype: JsonStr::plain("uint8"),
    }];
    let id = JsonStr::plain("b0-123");
    let sender = JsonStr::plain("shm:/ferry-123456-1@7f3a5c000000+2097152");
    let receiver = JsonStr::plain("shm:/ferry-123456-2@7f3a6c000000+2097152");
    let scalars = RawJson::parse_object("{}").map_err(|e| e.to_string())?;
    let msgs = [
        (
            "transfer_staged",
            Msg::Staged(Staged {
                request_id: id,
                data_size: size,
                manifest: Manifest::Entries(&tensor),
                session_id: sender,
                pool_ptr: 0x7f3a_5c00_0000,
                slot_offset: 0,
                scalar_fields: scalars,
            }),
        ),
        (
            "transfer_push",
            Msg::Push(Push {
                request_id: id,
                dest_session_id: receiver,
                dest_addr: 0x7f3a_6c00_0000,
                transfer_size: size,
            }),
        ),
        (
            "transfer_pushed",
            Msg::Pushed(Pushed {
                request_id: id,
                ..Pushed::default()
            }),
        ),
        (
            "transfer_ready",
            Msg::Ready(Ready {
                request_id: id,
                manifest: Manifest::Entries(&tensor),
                slot_offset: 0,
                scalar_fields: scalars,
                dest_session_id: receiver,
                prealloc_slot_id: Some(0),
            }),
        ),
    ];
    let mut out = vec![0u8; 4096];
    msgs.iter()
        .map(|(name, msg)| {
            let n = msg.encode(&mut out).map_err(|e| e.to_string())?;
            // The channel's packet: kind 2 (a message), the magic's length.
            let mut packet = vec![2, TRANSFER_MAGIC.len() as u8];
            packet.extend_from_slice(TRANSFER_MAGIC);
            packet.extend_from_slice(&out[..n]);
            Ok((*name, packet))
        })
        .collect()
}

/// A bare Unix socket pair with an echo thread on its far end.
pub struct UnixHops {
    near: UnixDatagram,
    buf: Vec<u8>,
    echo: Option<JoinHandle<()>>,
}

impl UnixHops {
    /// The pair, and the echo thread, which sends back whatever comes
    /// until the pair closes.
    pub fn start() -> io::Result<Self> {
        let (near, far) = UnixDatagram::pair()?;
        near.set_read_timeout(Some(Duration::from_secs(5)))?;
        let echo = std::thread::Builder::new()
            .name("ferry-hop-echo".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = far.recv(&mut buf) {
                    if n == 0 || far.send(&buf[..n]).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            near,
            buf: vec![0u8; 64 * 1024],
            echo: Some(echo),
        })
    }

    /// One round trip of `packet`: sent, echoed, received (each side
    /// sleeping in `recv` until it comes, as a thread without work does).
    pub fn round_trip(&mut self, packet: &[u8]) -> io::Result<Duration> {
        let t0 = Instant::now();
        self.near.send(packet)?;
        let n = self.near.recv(&mut self.buf)?;
        let took = t0.elapsed();
        if n != packet.len() {
            return Err(io::Error::other("the echo came back cut"));
        }
        Ok(took)
    }
}

impl Drop for UnixHops {
    fn drop(&mut self) {
        // An empty datagram ends the echo thread; one that cannot be sent
        // leaves it waiting, so it is not waited for.
        let ended = self.near.send(&[]).is_ok();
        if let Some(t) = self.echo.take().filter(|_| ended) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_path_is_four_messages_that_decode_as_what_they_name() {
        let path = fast_path(4096).unwrap();
        let names: Vec<_> = path.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "transfer_staged",
                "transfer_push",
                "transfer_pushed",
                "transfer_ready"
            ]
        );
        for (name, packet) in &path {
            let payload = &packet[2 + TRANSFER_MAGIC.len()..];
            let text = std::str::from_utf8(payload).unwrap();
            assert!(text.contains(name), "{name}: {text}");
            tensorferry_core::wire::decode(payload).unwrap();
        }
    }

    #[test]
    fn a_round_trip_comes_back_whole() {
        let mut hops = UnixHops::start().unwrap();
        for (_, packet) in fast_path(1 << 20).unwrap() {
            let took = hops.round_trip(&packet).unwrap();
            assert!(took > Duration::ZERO);
        }
    }
}
