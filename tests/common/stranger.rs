//! A stranger at an engine's notification inbox, speaking its stream as
//! the book describes it (docs/design.md, "Notifications on a path of
//! their own"): a 4-byte little-endian length, then a body whose first
//! byte is its kind (0: the sender's name, 1: a notification); under CURVE
//! a Noise IK handshake with the stranger's key first and every body
//! sealed. Written here from that description, not with the engine's own
//! code, so that a test sees what a peer that is not ferry can do.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tensorferry_zmq::{CurveKeyPair, CurvePublicKey};

fn framed(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// A TCP connection to `to` from the address `source` of this host.
fn connect_from(source: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let from: SocketAddr = format!("{source}:0").parse().unwrap();
    let (SocketAddr::V4(from), SocketAddr::V4(to)) = (from, to) else {
        panic!("IPv4 only");
    };
    let sockaddr = |a: std::net::SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream made of it below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` is the socket just made; it is closed with the stream.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let (a, b) = (sockaddr(from), sockaddr(to));
    // SAFETY: sockaddr_in values that live across the calls, their size
    // given.
    let rc = unsafe { libc::bind(fd, std::ptr::from_ref(&a).cast(), len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let rc = unsafe { libc::connect(fd, std::ptr::from_ref(&b).cast(), len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stream)
}

/// A socket to an inbox: TCP, or the inbox's Unix name.
trait Socket: Read + Write {}
impl Socket for TcpStream {}
impl Socket for UnixStream {}

/// Twenty notifications `message` at the inbox `inbox`
/// (`tcp://host:port`), by TCP from `source`, claiming to come from
/// `claimed`; with `key` (the stranger's pair and the inbox's public key)
/// after a handshake. Returns how many the socket took (a refused
/// stranger's connection is closed, so most fail).
pub fn notify_as(
    inbox: &str,
    source: &str,
    key: Option<(CurveKeyPair, CurvePublicKey)>,
    claimed: &str,
    message: &str,
) -> usize {
    let to: SocketAddr = inbox.trim_start_matches("tcp://").parse().unwrap();
    let Ok(s) = connect_from(source, to) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    speak(s, key, claimed, message)
}

/// As [`notify_as`], by the inbox's Unix name (a process of its host).
#[allow(dead_code)] // tests/endpoints_verbs.rs speaks by TCP only
pub fn notify_locally_as(
    inbox: &str,
    key: Option<(CurveKeyPair, CurvePublicKey)>,
    claimed: &str,
    message: &str,
) -> usize {
    let name = format!("tensorferry-notify/{}", inbox.trim_start_matches("tcp://"));
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
    let Ok(s) = UnixStream::connect_addr(&address) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    speak(s, key, claimed, message)
}

fn speak(
    mut s: impl Socket,
    key: Option<(CurveKeyPair, CurvePublicKey)>,
    claimed: &str,
    message: &str,
) -> usize {
    let mut seal = None;
    if let Some((mine, server)) = key {
        let params = "Noise_IK_25519_ChaChaPoly_BLAKE2s".parse().unwrap();
        let mut hs = snow::Builder::new(params)
            .local_private_key(mine.secret())
            .unwrap()
            .remote_public_key(&server.0)
            .unwrap()
            .build_initiator()
            .unwrap();
        let mut buf = [0u8; 256];
        let n = hs.write_message(&[], &mut buf).unwrap();
        if s.write_all(&framed(&buf[..n])).is_err() {
            return 0;
        }
        let mut header = [0u8; 4];
        if s.read_exact(&mut header).is_err() {
            return 0;
        }
        let len = u32::from_le_bytes(header) as usize;
        if len > buf.len() || s.read_exact(&mut buf[..len]).is_err() {
            return 0;
        }
        if hs.read_message(&buf[..len], &mut []).is_err() {
            return 0;
        }
        seal = Some(hs.into_transport_mode().unwrap());
    }
    let mut frame = |kind: u8, payload: &[u8]| {
        let mut body = vec![kind];
        body.extend_from_slice(payload);
        match &mut seal {
            Some(t) => {
                let mut sealed = vec![0u8; body.len() + 16];
                let n = t.write_message(&body, &mut sealed).unwrap();
                framed(&sealed[..n])
            }
            None => framed(&body),
        }
    };
    let mut took = 0;
    let mut stream = frame(0, claimed.as_bytes());
    for _ in 0..20 {
        stream.extend(frame(1, message.as_bytes()));
        if s.write_all(&stream).is_ok() {
            took += 1;
        }
        stream.clear();
        std::thread::sleep(Duration::from_millis(20));
    }
    took
}
