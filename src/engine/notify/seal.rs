//! Sealed notification streams, for engines with CURVE keys: a Noise
//! handshake (`Noise_IK_25519_ChaChaPoly_BLAKE2s`, by the `snow` crate)
//! with the engines' own CURVE key pairs, then every frame's body sealed.
//!
//! CurveZMQ's keys are Curve25519 keys, the same as Noise's `25519`, so
//! the keys a deployment already made for the control channel serve here
//! unchanged. In the IK pattern the sender knows the inbox's key (it is in
//! the inbox's session id) and proves its own in the first message; the
//! inbox learns it there, asks the guard whether it is admitted, and
//! answers with a message that binds the session to fresh keys of its
//! own, so a recorded stream cannot be replayed. What CURVE gave the
//! ZeroMQ inbox, this gives the socket: only admitted keys are heard, and
//! each connection's notifications are known to come from its key.

use std::io::{Read, Write};

use tensorferry_zmq::{CurveKeyPair, CurvePublicKey};

use super::frame::{self, HEADER, TAG};

const PATTERN: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";

/// The longest handshake message either side sends (IK's first: an
/// ephemeral key, the sealed static key and an empty sealed payload).
const MAX_HANDSHAKE: usize = 32 + (32 + TAG) + TAG;

/// A connection's keys once its handshake is done: seals what this side
/// sends, opens what it receives.
pub(super) struct Seal(snow::TransportState);

fn builder(ours: &CurveKeyPair) -> Result<snow::Builder<'_>, String> {
    let params: snow::params::NoiseParams = PATTERN.parse().map_err(|e| format!("{e}"))?;
    snow::Builder::new(params)
        .local_private_key(ours.secret())
        .map_err(|e| format!("this engine's CURVE key: {e}"))
}

impl Seal {
    /// The sender's side: runs the handshake over `stream` (blocking, as
    /// its timeouts allow) with the inbox whose key is `theirs`.
    pub(super) fn open(
        stream: &mut (impl Read + Write),
        ours: &CurveKeyPair,
        theirs: &CurvePublicKey,
    ) -> Result<Self, String> {
        let mut hs = builder(ours)?
            .remote_public_key(&theirs.0)
            .and_then(snow::Builder::build_initiator)
            .map_err(|e| format!("start a handshake: {e}"))?;
        let mut msg = [0u8; HEADER + MAX_HANDSHAKE];
        let n = hs
            .write_message(&[], &mut msg[HEADER..])
            .map_err(|e| format!("write the handshake: {e}"))?;
        msg[..HEADER].copy_from_slice(&(n as u32).to_le_bytes());
        stream
            .write_all(&msg[..HEADER + n])
            .map_err(|e| format!("send the handshake: {e}"))?;
        let mut header = [0u8; HEADER];
        stream
            .read_exact(&mut header)
            .map_err(|e| format!("no answer to the handshake: {e}"))?;
        let len = u32::from_le_bytes(header) as usize;
        let answer = msg
            .get_mut(..len)
            .ok_or_else(|| format!("an answer of {len} bytes to the handshake"))?;
        stream
            .read_exact(answer)
            .map_err(|e| format!("no answer to the handshake: {e}"))?;
        hs.read_message(answer, &mut [])
            .map_err(|e| format!("the inbox's answer does not prove its key: {e}"))?;
        hs.into_transport_mode()
            .map(Self)
            .map_err(|e| format!("end the handshake: {e}"))
    }

    /// The inbox's side: answers the sender's first handshake message
    /// `hello`. Returns the sender's key, the connection's seal, and the
    /// answer's frame, once `admit` took the key (else its refusal).
    pub(super) fn accept(
        ours: &CurveKeyPair,
        hello: &[u8],
        admit: impl FnOnce(&[u8; 32]) -> Result<(), String>,
    ) -> Result<([u8; 32], Self, Vec<u8>), String> {
        let mut hs = builder(ours)?
            .build_responder()
            .map_err(|e| format!("start a handshake: {e}"))?;
        hs.read_message(hello, &mut [])
            .map_err(|e| format!("not a handshake for this inbox's key: {e}"))?;
        let key: [u8; 32] = hs
            .get_remote_static()
            .and_then(|k| k.try_into().ok())
            .ok_or("a handshake without the sender's key")?;
        admit(&key)?;
        let mut answer = vec![0u8; HEADER + MAX_HANDSHAKE];
        let n = hs
            .write_message(&[], &mut answer[HEADER..])
            .map_err(|e| format!("write the handshake's answer: {e}"))?;
        answer.truncate(HEADER + n);
        answer[..HEADER].copy_from_slice(&(n as u32).to_le_bytes());
        let seal = hs
            .into_transport_mode()
            .map_err(|e| format!("end the handshake: {e}"))?;
        Ok((key, Self(seal), answer))
    }

    /// Appends `body` to `out` as one sealed frame.
    pub(super) fn put(&mut self, body: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let at = out.len();
        frame::put_header(out, body.len() + TAG);
        out.resize(at + HEADER + body.len() + TAG, 0);
        self.0
            .write_message(body, &mut out[at + HEADER..])
            .map(|_| ())
            .map_err(|e| {
                out.truncate(at);
                format!("seal a notification: {e}")
            })
    }

    /// Opens a sealed body into `into` (cleared first).
    pub(super) fn open_body(&mut self, sealed: &[u8], into: &mut Vec<u8>) -> Result<(), String> {
        into.clear();
        into.resize(sealed.len().saturating_sub(TAG), 0);
        let n = self
            .0
            .read_message(sealed, into)
            .map_err(|e| format!("a frame that does not open with the connection's keys: {e}"))?;
        into.truncate(n);
        Ok(())
    }
}
