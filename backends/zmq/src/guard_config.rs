//! A [`Guard`] from its settings: the addresses allowed and the CURVE
//! certificate files, given by a caller or, as a deployment sets them once
//! for every ferry object of a process, by the environment
//! ([`ALLOW_FROM_VAR`], [`CURVE_KEY_VAR`], [`CURVE_PEERS_VAR`]). The
//! command line, the Python package and the Rust engine read them here
//! alike, so that one setting means one thing everywhere.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::cert::CertError;
use crate::curve::CurveConfig;
use crate::guard::Guard;

/// The addresses that may connect, comma-separated (`--allow-from`).
pub const ALLOW_FROM_VAR: &str = "FERRY_ALLOW_FROM";
/// This process's secret CURVE certificate (`--curve-key`).
pub const CURVE_KEY_VAR: &str = "FERRY_CURVE_KEY";
/// The public CURVE certificates admitted: a directory of `*.key` files,
/// or one (`--curve-peers`).
pub const CURVE_PEERS_VAR: &str = "FERRY_CURVE_PEERS";

/// Why a guard's settings name no guard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// An allowed address that is not an IP address.
    #[error("{from}: {value:?} is not an IP address")]
    Address {
        /// The setting it came from (a variable's or a keyword's name).
        from: &'static str,
        /// The text.
        value: String,
    },
    /// A key without the peers it admits, or peers without a key.
    #[error("{given} is set without {missing}: CURVE needs both (this process's secret certificate, and the public certificates it admits)")]
    Half {
        /// The one given.
        given: &'static str,
        /// The one missing.
        missing: &'static str,
    },
    /// A certificate that cannot be used.
    #[error("{from}: {source}")]
    Certificate {
        /// The setting it came from.
        from: &'static str,
        /// What is wrong with it.
        source: CertError,
    },
}

/// A guard's configuration (its settings), as a caller or the environment
/// gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardConfig {
    /// The addresses that may connect to `tcp://` endpoints; empty: any.
    pub allow_from: Vec<String>,
    /// This process's secret certificate.
    pub curve_key: Option<PathBuf>,
    /// The public certificates admitted.
    pub curve_peers: Option<PathBuf>,
}

impl GuardConfig {
    /// The settings of the environment ([`ALLOW_FROM_VAR`],
    /// [`CURVE_KEY_VAR`], [`CURVE_PEERS_VAR`]); empty ones count as unset.
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        Self {
            allow_from: var(ALLOW_FROM_VAR)
                .map(|v| {
                    v.to_string_lossy()
                        .split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            curve_key: var(CURVE_KEY_VAR).map(PathBuf::from),
            curve_peers: var(CURVE_PEERS_VAR).map(PathBuf::from),
        }
    }

    /// These settings, with what they leave unset taken from the
    /// environment, in two parts: the allow-list, and CURVE's key and
    /// peers (a pair, taken together). With the names each setting goes by
    /// where it came from (`given` names the caller's), for
    /// [`guard`](Self::guard)'s errors.
    pub fn or_env(self, given: [&'static str; 3]) -> (Self, [&'static str; 3]) {
        let env = Self::from_env();
        let [allow_name, key_name, peers_name] = given;
        let (allow_from, allow_name) = if self.allow_from.is_empty() {
            (env.allow_from, ALLOW_FROM_VAR)
        } else {
            (self.allow_from, allow_name)
        };
        let curve_given = self.curve_key.is_some() || self.curve_peers.is_some();
        let (curve_key, curve_peers, key_name, peers_name) = if curve_given {
            (self.curve_key, self.curve_peers, key_name, peers_name)
        } else {
            (
                env.curve_key,
                env.curve_peers,
                CURVE_KEY_VAR,
                CURVE_PEERS_VAR,
            )
        };
        (
            Self {
                allow_from,
                curve_key,
                curve_peers,
            },
            [allow_name, key_name, peers_name],
        )
    }

    /// True if nothing is set.
    pub fn is_empty(&self) -> bool {
        self.allow_from.is_empty() && self.curve_key.is_none() && self.curve_peers.is_none()
    }

    /// The guard these settings name; `names` says what each setting is
    /// called where it came from (for errors): the allow-list's, the key's
    /// and the peers'.
    pub fn guard(&self, names: [&'static str; 3]) -> Result<Guard, GuardError> {
        let [allow_name, key_name, peers_name] = names;
        let allow = self
            .allow_from
            .iter()
            .map(|a| {
                a.trim().parse::<IpAddr>().map_err(|_| GuardError::Address {
                    from: allow_name,
                    value: a.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let curve = match (&self.curve_key, &self.curve_peers) {
            (Some(key), Some(peers)) => Some(load(key, key_name, peers, peers_name)?),
            (None, None) => None,
            (Some(_), None) => {
                return Err(GuardError::Half {
                    given: key_name,
                    missing: peers_name,
                })
            }
            (None, Some(_)) => {
                return Err(GuardError::Half {
                    given: peers_name,
                    missing: key_name,
                })
            }
        };
        Ok(Guard { allow, curve })
    }
}

fn load(
    key: &Path,
    key_name: &'static str,
    peers: &Path,
    peers_name: &'static str,
) -> Result<CurveConfig, GuardError> {
    Ok(CurveConfig {
        key: crate::cert::read_key_pair(key).map_err(|source| GuardError::Certificate {
            from: key_name,
            source,
        })?,
        peers: crate::cert::read_public_keys(peers).map_err(|source| GuardError::Certificate {
            from: peers_name,
            source,
        })?,
    })
}

impl Guard {
    /// The guard the environment names ([`GuardConfig::from_env`]): what
    /// every ferry object of a process takes for what it is not given
    /// ([`GuardConfig::or_env`]). No
    /// variable set: a guard that guards nothing.
    pub fn from_env() -> Result<Self, GuardError> {
        GuardConfig::from_env().guard([ALLOW_FROM_VAR, CURVE_KEY_VAR, CURVE_PEERS_VAR])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_their_guard_and_say_what_is_wrong() {
        let none = GuardConfig::default();
        assert!(none.is_empty());
        assert_eq!(none.guard(["a", "k", "p"]).unwrap(), Guard::default());
        let allow = GuardConfig {
            allow_from: vec!["127.0.0.1".into(), " ::1".into()],
            ..GuardConfig::default()
        };
        let g = allow.guard(["a", "k", "p"]).unwrap();
        assert_eq!(g.allow.len(), 2);
        assert!(g.curve.is_none());
        let bad = GuardConfig {
            allow_from: vec!["10.0.0.300".into()],
            ..GuardConfig::default()
        };
        let e = bad.guard(["allow_from", "k", "p"]).unwrap_err().to_string();
        assert!(e.contains("allow_from") && e.contains("10.0.0.300"), "{e}");
        let half = GuardConfig {
            curve_key: Some("/x".into()),
            ..GuardConfig::default()
        };
        let e = half
            .guard(["a", CURVE_KEY_VAR, CURVE_PEERS_VAR])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(CURVE_KEY_VAR) && e.contains(CURVE_PEERS_VAR),
            "{e}"
        );
        let missing = GuardConfig {
            curve_key: Some("/nonexistent/k.key_secret".into()),
            curve_peers: Some("/nonexistent/peers".into()),
            ..GuardConfig::default()
        };
        let e = missing
            .guard(["a", "curve_key", "p"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("curve_key: /nonexistent/k.key_secret"), "{e}");
    }
}
