//! A data plane's options as given (a name and key/value text, from a
//! command line or keyword arguments), read into its configuration with
//! errors that name the option at fault.

use std::str::FromStr;
use std::time::Duration;

/// Why a data plane could not be named or configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlaneError {
    /// No data plane has this name.
    #[error("no data plane is called {name:?} (this build has: {})", .available.join(", "))]
    Unknown {
        /// The name given.
        name: String,
        /// The names this build knows ([`DataPlane::names`](super::DataPlane::names)).
        available: &'static [&'static str],
    },
    /// The data plane exists but this build left it out: it is built
    /// with a Cargo feature of the tensorferry crate (and of ferry's
    /// command line). Python's modules say what to install instead.
    #[error("this build has no {name} data plane: build tensorferry (or the ferry command) with the Cargo feature `{feature}`")]
    NotBuilt {
        /// Its name.
        name: &'static str,
        /// The Cargo feature that builds it.
        feature: &'static str,
    },
    /// An option the data plane does not take.
    #[error("the {plane} data plane takes no option {key:?} (its options: {})", .takes.join(", "))]
    UnknownOption {
        /// The data plane.
        plane: &'static str,
        /// The option given.
        key: String,
        /// The options it takes.
        takes: &'static [&'static str],
    },
    /// An option whose value it cannot take.
    #[error("the {plane} data plane's option {key}: {value:?} {why}")]
    BadValue {
        /// The data plane.
        plane: &'static str,
        /// The option.
        key: &'static str,
        /// Its value as given.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// An option the data plane cannot do without.
    #[error("the {plane} data plane needs the option {key} ({what})")]
    Missing {
        /// The data plane.
        plane: &'static str,
        /// The option.
        key: &'static str,
        /// What it names, and where to find one.
        what: &'static str,
    },
}

/// The options given to one data plane, taken one by one; those left over
/// at the end are refused.
pub(super) struct Options {
    plane: &'static str,
    takes: &'static [&'static str],
    given: Vec<(String, String)>,
}

impl Options {
    pub(super) fn new<K, V>(
        plane: &'static str,
        takes: &'static [&'static str],
        given: impl IntoIterator<Item = (K, V)>,
    ) -> Self
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        Self {
            plane,
            takes,
            given: given
                .into_iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
                .collect(),
        }
    }

    /// The value of `key` as text, if given (the last one counts).
    pub(super) fn text(&mut self, key: &'static str) -> Option<String> {
        let mut found = None;
        while let Some(at) = self.given.iter().position(|(k, _)| k == key) {
            found = Some(self.given.remove(at).1);
        }
        found
    }

    /// The value of `key`, parsed, if given.
    pub(super) fn parsed<T>(&mut self, key: &'static str) -> Result<Option<T>, PlaneError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        self.text(key)
            .map(|v| {
                v.trim()
                    .parse::<T>()
                    .map_err(|e| self.bad(key, &v, e.to_string()))
            })
            .transpose()
    }

    /// The value of `key` as a duration (`250ms`, `5s`, `100us`, or bare
    /// seconds such as `1.5`), if given.
    pub(super) fn duration(&mut self, key: &'static str) -> Result<Option<Duration>, PlaneError> {
        self.text(key)
            .map(|v| parse_duration(&v).map_err(|why| self.bad(key, &v, why.to_owned())))
            .transpose()
    }

    /// `threads` (at least 1) and `split_at` (bytes), the copy options
    /// of the planes of one host, or the defaults given when absent; any
    /// other option is refused.
    pub(super) fn finish_copy(
        mut self,
        threads: usize,
        split_at: u64,
    ) -> Result<(usize, u64), PlaneError> {
        let given = self.parsed::<usize>("threads")?.map(|t| t.max(1));
        let split = self.parsed::<u64>("split_at")?;
        self.finish()?;
        Ok((given.unwrap_or(threads), split.unwrap_or(split_at)))
    }

    /// An error for `key`'s value `value`.
    pub(super) fn bad(&self, key: &'static str, value: &str, why: String) -> PlaneError {
        PlaneError::BadValue {
            plane: self.plane,
            key,
            value: value.to_owned(),
            why,
        }
    }

    /// Refuses the options no one took.
    pub(super) fn finish(self) -> Result<(), PlaneError> {
        match self.given.into_iter().next() {
            None => Ok(()),
            Some((key, _)) => Err(PlaneError::UnknownOption {
                plane: self.plane,
                key,
                takes: self.takes,
            }),
        }
    }
}

/// `250ms`, `5s`, `100us`, or bare seconds (`1.5`).
fn parse_duration(v: &str) -> Result<Duration, &'static str> {
    let v = v.trim();
    // Nanoseconds per unit.
    let (number, unit) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1_000_000u64)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1_000)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1_000_000_000)
    } else {
        (v, 1_000_000_000)
    };
    let why = "is not a duration (250ms, 5s, 100us, or seconds)";
    let n = number.trim();
    // Whole numbers exactly, so that `1500ms` is 1.5 s to the nanosecond.
    if let Ok(whole) = n.parse::<u64>() {
        return whole.checked_mul(unit).map(Duration::from_nanos).ok_or(why);
    }
    let x = n.parse::<f64>().map_err(|_| why)?;
    Duration::try_from_secs_f64(x * unit as f64 / 1e9).map_err(|_| why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_units() {
        for (text, want) in [
            ("1500ms", Duration::from_millis(1500)),
            ("5s", Duration::from_secs(5)),
            ("2.5", Duration::from_millis(2500)),
            ("100us", Duration::from_micros(100)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for text in ["soon", "-1"] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn leftover_and_bad_options_are_named() {
        let mut o = Options::new("shm", &["threads"], [("threads", "x"), ("colour", "red")]);
        let e = o.parsed::<usize>("threads").unwrap_err();
        assert!(e.to_string().contains("option threads: \"x\""), "{e}");
        let e = o.finish().unwrap_err();
        assert_eq!(
            e,
            PlaneError::UnknownOption {
                plane: "shm",
                key: "colour".into(),
                takes: &["threads"],
            }
        );
    }
}
