//! The metrics endpoint of a `ferry` process (`--metrics-listen`): its
//! nodes' [`Telemetry`] encoded on each `GET /metrics`, in OpenMetrics
//! text when the scraper asks for it (Prometheus does) and in Prometheus'
//! text format 0.0.4 otherwise (curl, older scrapers); and the probes a
//! service manager asks: `GET /healthz` (200 while the process serves) and
//! `GET /readyz` (200 while it takes work, 503 otherwise), as Kubernetes'
//! HTTP probes read them.
//!
//! One thread answers requests one at a time: a scrape encodes a few
//! kilobytes from atomics and short locks, so it never waits on a
//! hand-off, and no hand-off waits on it.
//!
//! It speaks plain HTTP, outside `--allow-from` and CURVE (Prometheus and
//! a kubelet's probes speak nothing else), so it listens where the
//! operator says, and on loopback when given a port alone.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tensorferry::runtime::telemetry::prometheus_client::encoding::{prometheus_text, text};
use tensorferry::runtime::telemetry::Telemetry;

/// `Content-Type` of OpenMetrics text.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of Prometheus' text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What `/readyz` answers: whether the process takes work now (an instance
/// registered with its coordinator and not draining; a coordinator bound
/// and not draining). Clones share one flag.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Says whether the process takes work.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether it takes work.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A running metrics endpoint; stops when dropped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The address `--metrics-listen` names: `host:port`, or a port alone,
/// which is loopback's (port 0 picks a free one).
pub fn listen_address(listen: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = listen.trim().parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    listen.parse().map_err(|e| {
        format!(
            "--metrics-listen {listen:?} is not an address:port or a port (e.g. 127.0.0.1:9464, or 9464 for loopback): {e}"
        )
    })
}

impl MetricsServer {
    /// Listens at `listen` (`host:port`, or a port alone on loopback;
    /// port 0 picks a free one) and
    /// serves `telemetry`; `/readyz` always answers ready.
    pub fn start(listen: &str, telemetry: Telemetry) -> Result<Self, String> {
        let ready = Readiness::new();
        ready.set(true);
        Self::with_readiness(listen, telemetry, ready)
    }

    /// Listens at `listen` and serves `telemetry`, with `/readyz` answering
    /// as `ready` says.
    pub fn with_readiness(
        listen: &str,
        telemetry: Telemetry,
        ready: Readiness,
    ) -> Result<Self, String> {
        let wanted = listen_address(listen)?;
        let server = tiny_http::Server::http(wanted)
            .map_err(|e| format!("cannot serve metrics at {wanted}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("the metrics server at {wanted} has no IP address"))?;
        let server = Arc::new(server);
        let s = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("ferry-metrics".into())
            .spawn(move || serve(&s, &telemetry, &ready))
            .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
        Ok(Self {
            server,
            addr,
            thread: Some(thread),
        })
    }

    /// The address it listens at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to scrape.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, telemetry: &Telemetry, ready: &Readiness) {
    let registry = telemetry.registry();
    for request in server.incoming_requests() {
        let response = answer(&request, &registry, ready);
        // A scraper that left before its answer needs nothing more.
        let _ = request.respond(response);
    }
}

fn answer(
    request: &tiny_http::Request,
    registry: &tensorferry::runtime::telemetry::prometheus_client::registry::Registry,
    ready: &Readiness,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let plain = |code: u16, body: &str| {
        typed(
            tiny_http::Response::from_string(body).with_status_code(code),
            "text/plain; charset=utf-8",
        )
    };
    let path = request.url().split('?').next().unwrap_or("");
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return plain(
            404,
            "ferry serves /metrics, /healthz (the process serves) and /readyz (it takes work)\n",
        );
    }
    if !matches!(
        request.method(),
        tiny_http::Method::Get | tiny_http::Method::Head
    ) {
        return plain(405, &format!("GET {path}\n"));
    }
    match path {
        "/healthz" => return plain(200, "ok\n"),
        "/readyz" if ready.is_ready() => return plain(200, "ready\n"),
        "/readyz" => return plain(503, "not ready\n"),
        _ => {}
    }
    let openmetrics = request.headers().iter().any(|h| {
        h.field.equiv("Accept") && h.value.as_str().contains("application/openmetrics-text")
    });
    let mut body = String::new();
    let (encoded, kind) = if openmetrics {
        (text::encode(&mut body, registry), OPENMETRICS)
    } else {
        (
            prometheus_text::encode(&mut body, registry),
            PROMETHEUS_TEXT,
        )
    };
    match encoded {
        Ok(()) => typed(tiny_http::Response::from_string(body), kind),
        Err(e) => plain(500, &format!("encoding the metrics failed: {e}\n")),
    }
}

/// `response` with its `Content-Type`.
fn typed<R: std::io::Read>(response: tiny_http::Response<R>, kind: &str) -> tiny_http::Response<R> {
    // The types above are fixed ASCII, which is all a header needs.
    match tiny_http::Header::from_bytes(&b"Content-Type"[..], kind.as_bytes()) {
        Ok(h) => response.with_header(h),
        Err(()) => response,
    }
}

#[cfg(test)]
mod listen_tests {
    use super::*;

    #[test]
    fn a_port_alone_is_loopbacks_and_an_address_is_as_given() {
        assert_eq!(
            listen_address("9464").unwrap().to_string(),
            "127.0.0.1:9464"
        );
        assert_eq!(listen_address("0").unwrap().to_string(), "127.0.0.1:0");
        assert_eq!(
            listen_address("0.0.0.0:9464").unwrap().to_string(),
            "0.0.0.0:9464"
        );
        assert_eq!(listen_address("[::1]:1").unwrap().to_string(), "[::1]:1");
        let e = listen_address("metrics:9464").unwrap_err();
        assert!(e.contains("9464 for loopback"), "{e}");
    }
}
