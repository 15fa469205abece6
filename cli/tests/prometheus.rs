//! The metrics endpoints under a real Prometheus server (Debian's
//! `prometheus`, which `scripts/test` installs; `FERRY_PROMETHEUS` names
//! another binary): a coordinator and two instances, separate processes,
//! serve `--metrics-listen` while hand-offs run; Prometheus scrapes them
//! every second; then its HTTP API is asked for the hand-off count and a
//! latency quantile, which must agree with what the processes report.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    coordinator_with, ferry, field, named_instance, num, result_endpoints, spawn_encoder, Procs,
};
use serde_json::Value;

const REQUESTS: u64 = 250;

/// A Prometheus server, killed on drop.
struct Prometheus {
    child: Child,
    base: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn prometheus_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_PROMETHEUS") {
        return p.into();
    }
    let debian = PathBuf::from("/usr/bin/prometheus");
    assert!(
        debian.exists(),
        "no Prometheus server at {} (scripts/test installs Debian's `prometheus`; \
         FERRY_PROMETHEUS names another)",
        debian.display()
    );
    debian
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`host:port`) every second,
    /// its storage under `dir`, and waits until it is ready.
    fn start(dir: &Path, targets: &[String]) -> Self {
        let config = dir.join("prometheus.yml");
        let targets: Vec<Value> = targets.iter().map(|t| Value::from(t.as_str())).collect();
        // YAML is a superset of JSON: the configuration is written by
        // serde_json.
        let doc = serde_json::json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [{
                "job_name": "ferry",
                "static_configs": [{"targets": targets}],
            }],
        });
        std::fs::write(&config, doc.to_string()).expect("write prometheus.yml");
        let listen = format!("127.0.0.1:{}", free_port());
        let child = Command::new(prometheus_binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let p = Self {
            child,
            base: format!("http://{listen}"),
        };
        let end = Instant::now() + Duration::from_secs(60);
        while ureq::get(&format!("{}/-/ready", p.base)).call().is_err() {
            assert!(Instant::now() < end, "prometheus not ready within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// The value of an instant query that yields one series, if it does.
    fn scalar(&self, query: &str) -> Option<f64> {
        let mut response = ureq::get(&format!("{}/api/v1/query", self.base))
            .query("query", query)
            .call()
            .ok()?;
        let body: Value = serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()?;
        let result = body["data"]["result"].as_array()?;
        match &result[..] {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits for `query` to yield `want`, for at most `secs`.
    fn await_value(&self, query: &str, want: f64, secs: u64) -> f64 {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let got = self.scalar(query);
            if got == Some(want) {
                return want;
            }
            assert!(
                Instant::now() < end,
                "prometheus: {query} = {got:?}, wanted {want}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Where a process serves its metrics: the `host:port` of its
/// `{"event":"metrics","url":...}` line.
fn target(line: &str) -> String {
    let url = field(line, "url");
    url.trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_owned()
}

/// The upper bounds ferry's latency histograms use, in seconds.
fn bounds() -> Vec<f64> {
    tensorferry::runtime::telemetry::latency_buckets().collect()
}

#[test]
fn prometheus_scrapes_the_hand_off_count_and_latency_the_processes_report() {
    let mut p = Procs::new("prom");
    let results = result_endpoints(&p, "c");
    let metrics = ["--metrics-listen", "127.0.0.1:0"];
    let c = coordinator_with(&mut p, &results, &metrics);
    let coordinator_at = target(&p.wait_for(c, "\"event\":\"metrics\"", 30));
    let workload = [
        "--workload",
        "random",
        "--seed",
        "5",
        "--max-bytes",
        "65536",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let d = p.spawn(
        "denoiser",
        &mut named_instance(&p, "denoiser", "denoiser", &results[1], &workload),
    );
    let denoiser_at = target(&p.wait_for(d, "\"event\":\"metrics\"", 30));
    p.wait_for(d, "\"event\":\"registered\"", 30);
    let requests = REQUESTS.to_string();
    // Paced, so that the run lasts about ten seconds of scrapes.
    let paced = ["--requests", &requests, "--window", "4", "--pace-ms", "40"];
    let e = spawn_encoder(&mut p, &results[0], &workload, &paced);
    let encoder_at = target(&p.wait_for(e, "\"event\":\"metrics\"", 30));

    // Each endpoint answers a plain scrape in Prometheus' text format.
    let mut direct = ureq::get(&format!("http://{encoder_at}/metrics"))
        .call()
        .expect("scrape the encoder");
    let text = direct.body_mut().read_to_string().unwrap();
    assert!(
        text.contains("# TYPE ferry_write_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("ferry_requests_sent_total{role=\"encoder\",node=\"encoder\"}"),
        "{text}"
    );

    let prom = Prometheus::start(
        &p.dir,
        &[coordinator_at, denoiser_at.clone(), encoder_at.clone()],
    );
    let encoded = p.wait_for(e, "\"event\":\"encoded\"", 120);
    assert_eq!(num(&encoded, "sent"), REQUESTS, "{encoded}");
    for _ in 0..REQUESTS {
        let line = p.wait_for(c, "\"leg\"", 60);
        assert!(line.contains("\"event\":\"delivered\""), "{line}");
    }

    // The count, once Prometheus has scraped the end of the run.
    let handoffs = "sum(ferry_coordinator_handoffs_total{leg=\"encoder\"})";
    prom.await_value(handoffs, REQUESTS as f64, 30);
    prom.await_value(
        "sum(ferry_coordinator_handoff_seconds_count{leg=\"encoder\"})",
        REQUESTS as f64,
        30,
    );
    prom.await_value(
        "sum(ferry_requests_sent_total{node=\"encoder\"})",
        REQUESTS as f64,
        30,
    );
    prom.await_value(
        "sum(ferry_write_seconds_count{node=\"encoder\"})",
        REQUESTS as f64,
        30,
    );
    prom.await_value(
        "sum(ferry_transfers_released_total{node=\"denoiser\"})",
        REQUESTS as f64,
        30,
    );
    // Scraped during the run, not only after it: some scrape saw part.
    let least = prom
        .scalar(&format!("min_over_time({handoffs}[5m:1s])"))
        .expect("the count's history");
    assert!(least < REQUESTS as f64, "every scrape saw the whole run");

    let p50 = prom
        .scalar(
            "histogram_quantile(0.5, sum by (le) (ferry_coordinator_handoff_seconds_bucket{leg=\"encoder\"}))",
        )
        .expect("the median hand-off");

    let s = p.finish(c);
    let summary: Value = serde_json::from_str(&s).unwrap();
    let leg = &summary["legs"]["encoder"];
    assert_eq!(leg["delivered"], REQUESTS, "{s}");
    assert_eq!(leg["handoff_count"], REQUESTS, "{s}");
    let min = leg["handoff_min_us"].as_f64().unwrap() / 1e6;
    let max = leg["handoff_max_us"].as_f64().unwrap() / 1e6;
    // Prometheus interpolates inside a bucket: the median lies between
    // the lower bound of the least observation's bucket and the upper
    // bound of the greatest's.
    let b = bounds();
    let floor = b.iter().copied().filter(|&x| x < min).fold(0.0, f64::max);
    let ceiling = b
        .iter()
        .copied()
        .find(|&x| x >= max)
        .unwrap_or(f64::INFINITY);
    assert!(
        floor <= p50 && p50 <= ceiling,
        "median {p50} s outside [{floor}, {ceiling}] (observed {min}..{max} s)"
    );
    let s = p.finish(e);
    assert_eq!(num(&s, "sent"), REQUESTS, "{s}");
    let s = p.finish(d);
    assert_eq!(num(&s, "verified"), REQUESTS, "{s}");
    drop(prom);
}

#[test]
fn a_metrics_address_that_cannot_be_served_is_refused_with_the_reason() {
    let p = Procs::new("prom-bad");
    let results = result_endpoints(&p, "c");
    // Held while the coordinator tries its port.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    for (listen, why) in [
        ("not-an-address", "is not an address:port"),
        (taken.as_str(), "cannot serve metrics at"),
    ] {
        let out = ferry()
            .args(["coordinator", "--control", "zmq"])
            .args(["--listen", &results.join(",")])
            .args(["--metrics-listen", listen])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{listen}: {text}");
        assert!(
            text.contains("\"what\":\"metrics\"") && text.contains(why),
            "{listen}: {text}"
        );
    }
    drop(held);
}
