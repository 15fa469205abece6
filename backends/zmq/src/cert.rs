//! CURVE certificates on disk, in the format czmq's `zcert` and pyzmq's
//! `zmq.auth.create_certificates` write (ZPL, ZeroMQ's RFC 4): `NAME.key`
//! holds the public key, `NAME.key_secret` both keys, each as
//!
//! ```text
//! metadata
//! curve
//!     public-key = "<40 characters of Z85>"
//!     secret-key = "<40 characters of Z85>"
//! ```
//!
//! with `#` comments and any `metadata` entries, which are read past. A
//! key made by either tool works in the other.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::curve::{CurveKeyPair, CurvePublicKey, KeyTextError};

/// A certificate that cannot be read or written: the file, the line (when
/// one is at fault) and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {why}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct CertError {
    /// The file (or directory).
    pub path: PathBuf,
    /// The 1-based line at fault, if one is.
    pub line: Option<usize>,
    /// What is wrong.
    pub why: String,
}

/// The keys a certificate's `curve` section holds, with their lines.
#[derive(Default)]
struct Keys {
    public: Option<(String, usize)>,
    secret: Option<(String, usize)>,
}

/// A ZPL value: quoted ("..." or '...') or bare up to a comment.
fn value(text: &str) -> Result<&str, &'static str> {
    let text = text.trim();
    for q in ['"', '\''] {
        if let Some(rest) = text.strip_prefix(q) {
            let end = rest
                .find(q)
                .ok_or("a quoted value without its closing quote")?;
            let after = rest[end + 1..].trim();
            if !(after.is_empty() || after.starts_with('#')) {
                return Err("text after a quoted value");
            }
            return Ok(&rest[..end]);
        }
    }
    Ok(text.split('#').next().unwrap_or("").trim())
}

/// Reads the `curve` section's keys from a certificate's text.
fn parse(text: &str) -> Result<Keys, (Option<usize>, String)> {
    let mut keys = Keys::default();
    let mut section = String::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches('\r');
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if line.starts_with('\t') {
            return Err((
                Some(n),
                "indented with a tab (ZPL indents by four spaces)".into(),
            ));
        }
        let indented = body.len() != line.len();
        let (name, val) = match body.split_once('=') {
            Some((name, val)) => (name.trim(), Some(val)),
            None => (body.split('#').next().unwrap_or("").trim(), None),
        };
        if !indented {
            section = name.to_owned();
            continue;
        }
        if section != "curve" {
            continue;
        }
        let slot = match name {
            "public-key" => &mut keys.public,
            "secret-key" => &mut keys.secret,
            _ => continue,
        };
        let Some(val) = val else {
            return Err((Some(n), format!("{name} without `= \"<key>\"`")));
        };
        if slot.is_some() {
            return Err((Some(n), format!("a second {name}")));
        }
        let v = value(val).map_err(|why| (Some(n), format!("{name}: {why}")))?;
        *slot = Some((v.to_owned(), n));
    }
    Ok(keys)
}

fn read(path: &Path) -> Result<Keys, CertError> {
    let bad = |line, why| CertError {
        path: path.to_owned(),
        line,
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(None, e.to_string()))?;
    parse(&text).map_err(|(line, why)| bad(line, why))
}

fn key_error(path: &Path, name: &str, line: usize, e: KeyTextError) -> CertError {
    CertError {
        path: path.to_owned(),
        line: Some(line),
        why: format!("{name}: {e}"),
    }
}

/// The public key of the certificate at `path`.
pub fn read_public_key(path: &Path) -> Result<CurvePublicKey, CertError> {
    let keys = read(path)?;
    let (text, line) = keys.public.ok_or_else(|| CertError {
        path: path.to_owned(),
        line: None,
        why: "no `public-key` in a `curve` section: not a CURVE certificate".into(),
    })?;
    CurvePublicKey::from_z85(&text).map_err(|e| key_error(path, "public-key", line, e))
}

/// The key pair of the secret certificate at `path`. A file others than
/// its owner may read is refused: a secret key others can read is no
/// longer this process's alone (pyzmq writes its secret files with the
/// process's umask, so `chmod 600` them; `ferry keygen` writes them
/// 0600).
pub fn read_key_pair(path: &Path) -> Result<CurveKeyPair, CertError> {
    let keys = read(path)?;
    let missing = |what: &str| CertError {
        path: path.to_owned(),
        line: None,
        why: format!(
            "no `{what}` in a `curve` section: not a secret CURVE certificate (NAME.key_secret)"
        ),
    };
    let (public, pl) = keys.public.ok_or_else(|| missing("public-key"))?;
    let (secret, sl) = keys.secret.ok_or_else(|| missing("secret-key"))?;
    CurvePublicKey::from_z85(&public).map_err(|e| key_error(path, "public-key", pl, e))?;
    let pair = CurveKeyPair::from_z85(&public, &secret)
        .map_err(|e| key_error(path, "secret-key", sl, e))?;
    let meta = std::fs::metadata(path).map_err(|e| CertError {
        path: path.to_owned(),
        line: None,
        why: e.to_string(),
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(CertError {
            path: path.to_owned(),
            line: None,
            why: format!(
                "a secret certificate others than its owner may read (mode {mode:o}) is not used: chmod 600 it"
            ),
        });
    }
    Ok(pair)
}

/// The public keys at `path`: every `*.key` certificate in a directory
/// (in name order; secret `*.key_secret` files and anything else are
/// left alone), or the one certificate a file is.
pub fn read_public_keys(path: &Path) -> Result<Vec<CurvePublicKey>, CertError> {
    let meta = std::fs::metadata(path).map_err(|e| CertError {
        path: path.to_owned(),
        line: None,
        why: e.to_string(),
    })?;
    if !meta.is_dir() {
        return Ok(vec![read_public_key(path)?]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| CertError {
        path: path.to_owned(),
        line: None,
        why: e.to_string(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "key") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(CertError {
            path: path.to_owned(),
            line: None,
            why: "no public certificate (*.key) in this directory".into(),
        });
    }
    files.iter().map(|f| read_public_key(f)).collect()
}

/// The text of a certificate: the public key, and the secret one if given.
fn certificate(public: &CurvePublicKey, secret: Option<&str>) -> String {
    let mut out = String::new();
    out.push_str("#   ****  Generated by ferry keygen  ****\n");
    if secret.is_some() {
        out.push_str("#   ZeroMQ CURVE **Secret** Certificate\n");
        out.push_str("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n");
    } else {
        out.push_str("#   ZeroMQ CURVE Public Certificate\n");
        out.push_str("#   Exchange securely, or use a secure mechanism to verify the contents\n");
        out.push_str("#   of this file after exchange.\n");
    }
    out.push_str("\nmetadata\ncurve\n");
    out.push_str(&format!("    public-key = \"{}\"\n", public.to_z85()));
    if let Some(s) = secret {
        out.push_str(&format!("    secret-key = \"{s}\"\n"));
    }
    out
}

fn create(path: &Path, mode: u32, text: &str) -> Result<(), CertError> {
    let bad = |why: String| CertError {
        path: path.to_owned(),
        line: None,
        why,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                bad("exists already; a key is not overwritten (remove it first)".into())
            }
            _ => bad(e.to_string()),
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| bad(e.to_string()))
}

/// Writes `pair` as `dir/NAME.key` (public, mode 0644) and
/// `dir/NAME.key_secret` (both keys, mode 0600), creating `dir`; refuses
/// to replace either file. Returns their paths.
pub fn write_certificates(
    dir: &Path,
    name: &str,
    pair: &CurveKeyPair,
) -> Result<(PathBuf, PathBuf), CertError> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(CertError {
            path: dir.join(name),
            line: None,
            why: "a certificate's name must be a plain file name".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| CertError {
        path: dir.to_owned(),
        line: None,
        why: e.to_string(),
    })?;
    let public = dir.join(format!("{name}.key"));
    let secret = dir.join(format!("{name}.key_secret"));
    create(
        &secret,
        0o600,
        &certificate(pair.public(), Some(&pair.secret_z85())),
    )?;
    create(&public, 0o644, &certificate(pair.public(), None))?;
    Ok((public, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret certificate as pyzmq 27 writes it, with metadata.
    const PYZMQ_SECRET: &str = "#   ****  Generated on 2026-12-02 16:56:14.925642 by pyzmq  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

metadata
    name = x y
    role = coordinator
curve
    public-key = \"5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E\"
    secret-key = \"C(*tf)M?hE<1Vo.7AiKeM}:6CC7v+Ev]7::%6i(F\"
";

    fn dir(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("ferry-cert-{}-{tag}", std::process::id()))
    }

    #[test]
    fn pyzmq_certificates_parse_with_their_metadata_and_comments() {
        let k = parse(PYZMQ_SECRET).map_err(|e| e.1).unwrap();
        assert_eq!(
            k.public.unwrap(),
            ("5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E".to_owned(), 9)
        );
        assert_eq!(k.secret.unwrap().1, 10);
        // czmq writes single quotes or none as well; a comment may follow.
        let k = parse("curve\n    public-key = '5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E'  # c\n")
            .map_err(|e| e.1)
            .unwrap();
        assert_eq!(
            k.public.unwrap().0,
            "5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E"
        );
    }

    #[test]
    fn bad_certificates_name_the_file_the_line_and_the_fault() {
        let d = dir("bad");
        std::fs::create_dir_all(&d).unwrap();
        let cases = [
            ("short.key", "curve\n    public-key = \"abc\"\n", Some(2), "3 characters"),
            ("tab.key", "curve\n\tpublic-key = \"x\"\n", Some(2), "tab"),
            ("open.key", "curve\n    public-key = \"abc\n", Some(2), "closing quote"),
            ("twice.key", "curve\n    public-key = \"5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E\"\n    public-key = \"5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E\"\n", Some(3), "a second"),
            ("none.key", "metadata\n    public-key = \"x\"\n", None, "no `public-key`"),
            ("char.key", "curve\n    public-key = \"5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?~\"\n", Some(2), "'~' at character 40"),
        ];
        for (name, text, line, why) in cases {
            let p = d.join(name);
            std::fs::write(&p, text).unwrap();
            let e = read_public_key(&p).unwrap_err();
            assert_eq!(e.line, line, "{e}");
            assert!(e.why.contains(why), "{name}: {e}");
            let shown = e.to_string();
            assert!(shown.starts_with(&p.display().to_string()), "{shown}");
        }
        // A public certificate is not a key pair.
        let e = read_key_pair(&d.join("none.key")).unwrap_err();
        assert!(e.why.contains("not a secret CURVE certificate"), "{e}");
        let e = read_public_keys(&d.join("missing")).unwrap_err();
        assert!(e.why.contains("No such file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn written_certificates_read_back_with_a_private_secret_file() {
        let d = dir("write");
        let pair = CurveKeyPair::generate().unwrap();
        let (public, secret) = write_certificates(&d, "coordinator", &pair).unwrap();
        assert_eq!(public, d.join("coordinator.key"));
        assert_eq!(secret, d.join("coordinator.key_secret"));
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_key_pair(&secret).unwrap(), pair);
        assert_eq!(read_public_key(&public).unwrap(), *pair.public());
        // A secret file others may read is refused, and says the fix.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_key_pair(&secret).unwrap_err();
        assert!(
            e.why.contains("mode 640") && e.why.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Never overwritten.
        let e = write_certificates(&d, "coordinator", &pair).unwrap_err();
        assert!(e.why.contains("exists already"), "{e}");
        // A directory yields its *.key files, not the secret ones.
        let other = CurveKeyPair::generate().unwrap();
        write_certificates(&d, "encoder", &other).unwrap();
        let keys = read_public_keys(&d).unwrap();
        assert_eq!(keys, vec![*pair.public(), *other.public()]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
