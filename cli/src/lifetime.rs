//! How long a `ferry coordinator` or `ferry instance` runs: until SIGTERM
//! or SIGINT, whatever its stdin is, as service managers expect (systemd,
//! containers and Kubernetes start a daemon with stdin at `/dev/null` and
//! stop it with SIGTERM). The first signal asks for a drain; a second ends
//! at once. Closing stdin ends a process only when asked to
//! (`--exit-on-stdin-close`): the pipeline launcher and the tests stop
//! their children that way.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

/// What the process is asked to do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Nothing: go on.
    Run,
    /// Stop taking work, finish what is in flight (within the grace
    /// period), then end.
    Drain,
    /// End at once (a second signal): what is in flight fails.
    Now,
}

/// Why the process stops, as its summary reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A signal, by number.
    Signal(i32),
    /// Stdin closed (with `--exit-on-stdin-close`).
    StdinClosed,
}

impl Cause {
    /// Its name in reports: `SIGTERM`, `SIGINT`, `stdin closed`.
    pub fn name(self) -> String {
        match self {
            Self::Signal(SIGTERM) => "SIGTERM".to_owned(),
            Self::Signal(SIGINT) => "SIGINT".to_owned(),
            Self::Signal(n) => format!("signal {n}"),
            Self::StdinClosed => "stdin closed".to_owned(),
        }
    }
}

/// The process's lifetime: the signals received so far, and stdin's end
/// if it counts.
pub struct Lifetime {
    signals: Arc<AtomicUsize>,
    /// The first signal's number (0: none yet).
    first: Arc<AtomicI32>,
    stdin_closed: Arc<AtomicBool>,
    handle: Handle,
}

impl std::fmt::Debug for Lifetime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifetime")
            .field("stop", &self.stop())
            .finish_non_exhaustive()
    }
}

impl Lifetime {
    /// Takes over SIGTERM and SIGINT (from now on they no longer kill the
    /// process) and, with `exit_on_stdin_close`, watches stdin.
    pub fn start(exit_on_stdin_close: bool) -> std::io::Result<Self> {
        reset_stop_signals()?;
        let mut signals = Signals::new([SIGTERM, SIGINT])?;
        let handle = signals.handle();
        let count = Arc::new(AtomicUsize::new(0));
        let first = Arc::new(AtomicI32::new(0));
        let (c, f) = (Arc::clone(&count), Arc::clone(&first));
        std::thread::Builder::new()
            .name("ferry-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    let _ = f.compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire);
                    c.fetch_add(1, Ordering::AcqRel);
                }
            })?;
        let stdin_closed = Arc::new(AtomicBool::new(false));
        if exit_on_stdin_close {
            let closed = Arc::clone(&stdin_closed);
            std::thread::Builder::new()
                .name("ferry-stdin".into())
                .spawn(move || {
                    let mut sink = [0u8; 64];
                    let mut stdin = std::io::stdin();
                    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                    closed.store(true, Ordering::Release);
                })?;
        }
        Ok(Self {
            signals: count,
            first,
            stdin_closed,
            handle,
        })
    }

    /// What the process is asked to do now: the first stop (a signal, or
    /// stdin's end if it counts) asks for a drain, the next one for the
    /// end.
    pub fn stop(&self) -> Stop {
        let stdin = usize::from(self.stdin_closed.load(Ordering::Acquire));
        match self.signals.load(Ordering::Acquire) + stdin {
            0 => Stop::Run,
            1 => Stop::Drain,
            _ => Stop::Now,
        }
    }

    /// True while nothing asks the process to stop.
    pub fn running(&self) -> bool {
        self.stop() == Stop::Run
    }

    /// Why the process stops (`None` while it runs).
    pub fn cause(&self) -> Option<Cause> {
        match self.first.load(Ordering::Acquire) {
            0 if self.stdin_closed.load(Ordering::Acquire) => Some(Cause::StdinClosed),
            0 => None,
            sig => Some(Cause::Signal(sig)),
        }
    }

    /// Sleeps up to `wait`, waking early when a stop is asked for (within
    /// a few milliseconds).
    pub fn sleep(&self, wait: Duration) {
        let end = Instant::now() + wait;
        let start = self.stop();
        while self.stop() == start {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(5)));
        }
    }
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        // Ends the signal thread's loop.
        self.handle.close();
    }
}

/// Sets SIGTERM and SIGINT back to their default action, once per
/// process (a second [`Lifetime`] must not undo the first's handlers).
///
/// libfabric as Debian builds it links libpsm_infinipath, whose load-time
/// constructor installs handlers of its own for both (they exit(1) at
/// once), and signal-hook calls whatever handler it finds installed after
/// its own: left there, that handler would end the process before its
/// drain. The process takes both signals over right after this.
fn reset_stop_signals() -> std::io::Result<()> {
    static RESET: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let done = RESET.get_or_init(|| {
        for sig in [SIGTERM, SIGINT] {
            // SAFETY: `sigaction` with a zeroed `struct sigaction` whose
            // handler is SIG_DFL installs the default action: no function
            // of ours runs in signal context, and no Rust code relies on
            // the handler it replaces. Both pointers are valid for the
            // call (the old action is not asked for).
            #[allow(unsafe_code)]
            let rc = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    done.map_err(std::io::Error::from_raw_os_error)
}

/// A drain's grace period from the command line, in seconds.
pub fn parse_drain_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{s:?} is not a duration in seconds (0 or more)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_timeouts_parse_as_seconds() {
        assert_eq!(parse_drain_timeout("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_drain_timeout("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_drain_timeout("0"), Ok(Duration::ZERO));
        assert!(parse_drain_timeout("-1").unwrap_err().contains("\"-1\""));
        assert!(parse_drain_timeout("soon").unwrap_err().contains("soon"));
    }

    #[test]
    fn the_command_lines_default_drain_is_the_pipelines() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            lifetime: crate::pipeline::LifetimeArgs,
        }
        let cli = <Cli as clap::Parser>::parse_from(["ferry"]);
        assert_eq!(cli.lifetime.drain_timeout, crate::pipeline::DRAIN_TIMEOUT);
        assert!(!cli.lifetime.exit_on_stdin_close);
    }
}
