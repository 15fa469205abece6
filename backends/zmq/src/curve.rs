//! CurveZMQ keys: a process's key pair, the public keys it admits, and
//! their Z85 text (ZeroMQ's RFC 32), the form every certificate and log
//! line uses.

use std::fmt;

use crate::zmq;

/// Z85's alphabet: the character of each value 0..85.
const Z85: &[u8; 85] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/// Characters of a 32-byte key in Z85.
pub const KEY_TEXT_LEN: usize = 40;

/// Why a text is not a key in Z85.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyTextError {
    /// Not 40 characters.
    #[error("{0} characters; a CURVE key in Z85 has 40")]
    Length(usize),
    /// A character outside Z85's alphabet, at this 1-based column.
    #[error("{0:?} at character {1} is not a Z85 character")]
    Character(char, usize),
    /// Five characters, from this 1-based column, whose value does not
    /// fit four bytes.
    #[error("the five characters from character {0} encode no four bytes (value past 2^32)")]
    Overflow(usize),
}

fn value_of(c: u8) -> Option<u32> {
    Z85.iter().position(|&z| z == c).map(|v| v as u32)
}

/// A 32-byte key as its 40 characters of Z85.
fn encode(key: &[u8; 32]) -> String {
    let mut out = String::with_capacity(KEY_TEXT_LEN);
    for chunk in key.chunks_exact(4) {
        let mut v = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let mut five = [0u8; 5];
        for c in five.iter_mut().rev() {
            *c = Z85[(v % 85) as usize];
            v /= 85;
        }
        out.extend(five.iter().map(|&c| c as char));
    }
    out
}

/// 40 characters of Z85 as the 32-byte key they encode.
fn decode(text: &str) -> Result<[u8; 32], KeyTextError> {
    let chars = text.chars().count();
    if chars != KEY_TEXT_LEN || text.len() != KEY_TEXT_LEN {
        return Err(KeyTextError::Length(chars));
    }
    let mut key = [0u8; 32];
    for (i, chunk) in text.as_bytes().chunks_exact(5).enumerate() {
        let mut v: u64 = 0;
        for (j, &c) in chunk.iter().enumerate() {
            let d = value_of(c).ok_or(KeyTextError::Character(c as char, i * 5 + j + 1))?;
            v = v * 85 + u64::from(d);
        }
        let v = u32::try_from(v).map_err(|_| KeyTextError::Overflow(i * 5 + 1))?;
        key[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
    Ok(key)
}

/// A CURVE public key: who a peer is.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CurvePublicKey(pub [u8; 32]);

impl CurvePublicKey {
    /// The key its 40 characters of Z85 name.
    pub fn from_z85(text: &str) -> Result<Self, KeyTextError> {
        decode(text).map(Self)
    }

    /// Its 40 characters of Z85.
    pub fn to_z85(&self) -> String {
        encode(&self.0)
    }
}

impl fmt::Display for CurvePublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_z85())
    }
}

impl fmt::Debug for CurvePublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CurvePublicKey({})", self.to_z85())
    }
}

/// A process's CURVE key pair. Its secret half is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct CurveKeyPair {
    public: CurvePublicKey,
    secret: [u8; 32],
}

impl fmt::Debug for CurveKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurveKeyPair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl CurveKeyPair {
    /// A new key pair from libzmq (libsodium's random source).
    pub fn generate() -> Result<Self, zmq::Error> {
        if zmq::has("curve") != Some(true) {
            return Err(zmq::Error::ENOTSUP);
        }
        let pair = zmq::CurveKeyPair::new()?;
        Ok(Self {
            public: CurvePublicKey(pair.public_key),
            secret: pair.secret_key,
        })
    }

    /// The pair of these keys, in Z85. That the public key belongs to the
    /// secret one is not checked here: a mismatch shows as every peer
    /// refusing this process.
    pub fn from_z85(public: &str, secret: &str) -> Result<Self, KeyTextError> {
        Ok(Self {
            public: CurvePublicKey::from_z85(public)?,
            secret: decode(secret)?,
        })
    }

    /// Its public key.
    pub fn public(&self) -> &CurvePublicKey {
        &self.public
    }

    /// Its secret key in Z85 (for writing a certificate).
    pub fn secret_z85(&self) -> String {
        encode(&self.secret)
    }

    /// Its secret key's bytes, for a handshake that proves this process
    /// holds it (the engine's sealed notifications); never sent.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }
}

/// CurveZMQ between ferry processes: this process's key pair and the
/// public keys it admits. Every socket a channel binds becomes a CURVE
/// server that lets in only `peers`; every socket it connects is a CURVE
/// client that knows its server's key (see [`Guard`](crate::Guard)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurveConfig {
    /// This process's key pair (`--curve-key`).
    pub key: CurveKeyPair,
    /// The public keys admitted (`--curve-peers`): at a coordinator its
    /// instances'; at an instance its coordinator's, the one key it also
    /// connects to.
    pub peers: Vec<CurvePublicKey>,
}

impl CurveConfig {
    /// The key pair of the secret certificate at `key` and the public keys
    /// of the certificates at `peers` (a directory of `*.key` files, or
    /// one file): as `zmq.auth.create_certificates` (pyzmq) and czmq's
    /// `zcert` write them, and `ferry keygen`.
    pub fn load(key: &std::path::Path, peers: &std::path::Path) -> Result<Self, crate::CertError> {
        Ok(Self {
            key: crate::cert::read_key_pair(key)?,
            peers: crate::cert::read_public_keys(peers)?,
        })
    }

    /// True if `key` is admitted.
    pub fn admits(&self, key: &CurvePublicKey) -> bool {
        self.peers.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z85_round_trips_and_matches_the_rfc_vector() {
        // RFC 32's test vector: 8 bytes, "HelloWorld".
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&[0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B]);
        let text = encode(&key);
        assert!(text.starts_with("HelloWorld"), "{text}");
        assert_eq!(decode(&text).unwrap(), key);
        let all = [0xffu8; 32];
        assert_eq!(decode(&encode(&all)).unwrap(), all);
    }

    #[test]
    fn bad_key_text_says_what_is_wrong() {
        assert_eq!(decode("abc"), Err(KeyTextError::Length(3)));
        let mut t = "0".repeat(40);
        t.replace_range(7..8, "~");
        assert_eq!(decode(&t), Err(KeyTextError::Character('~', 8)));
        // "#####" is 85^5 - 1, past u32::MAX.
        let t = format!("{}{}", "#####", "0".repeat(35));
        assert_eq!(decode(&t), Err(KeyTextError::Overflow(1)));
        let t = "é".repeat(20);
        assert_eq!(decode(&t), Err(KeyTextError::Length(20)));
    }

    #[test]
    fn generated_pairs_are_distinct_and_never_print_their_secret() {
        let a = CurveKeyPair::generate().unwrap();
        let b = CurveKeyPair::generate().unwrap();
        assert_ne!(a.public(), b.public());
        let shown = format!("{a:?}");
        assert!(!shown.contains(&a.secret_z85()), "{shown}");
        assert!(shown.contains(&a.public().to_z85()), "{shown}");
    }
}
