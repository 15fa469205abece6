//! Two hosts on one machine: network namespaces joined by a veth pair. The
//! coordinator and an encoder run in one, a denoiser in the other; control
//! over ZeroMQ on TCP and bytes over libfabric's `tcp;ofi_rxm` between the
//! veth addresses. Then the link is cut mid-run: the requests in flight
//! must fail within their timeouts, and nothing may stay held.
//!
//! Needs root (to create namespaces), so it is ignored, with the command
//! that runs it; `scripts/test` (root already) runs it. Run and unable to
//! make the namespaces, it fails with the reason: it never passes untried.
#![cfg(feature = "fabric")]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_clean, ferry, num, Procs};

const A_ADDR: &str = "10.77.1.1";
const B_ADDR: &str = "10.77.1.2";

/// Two namespaces and the veth pair between them, removed on drop.
struct Hosts {
    a: String,
    b: String,
    /// Host A's end of the link.
    link_a: String,
}

/// The prefix of the namespaces' names: `ferry`, unless
/// `FERRY_NETNS_PREFIX` names another (letters, digits and `-`), as
/// `scripts/test` does to find the namespaces its run made.
fn netns_prefix() -> String {
    std::env::var("FERRY_NETNS_PREFIX")
        .ok()
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .unwrap_or_else(|| "ferry".to_owned())
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    fn new(tag: &str) -> Result<Self, String> {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let (va, vb) = (format!("fa{id}"), format!("fb{id}"));
        let prefix = netns_prefix();
        let hosts = Self {
            a: format!("{prefix}-{id}-a"),
            b: format!("{prefix}-{id}-b"),
            link_a: va.clone(),
        };
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &hosts.a])?;
        ip(&["link", "set", &vb, "netns", &hosts.b])?;
        for (ns, dev, addr) in [(&hosts.a, &va, A_ADDR), (&hosts.b, &vb, B_ADDR)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// `ferry <args>` in namespace `ns`.
    fn ferry(ns: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(ferry().get_program());
        c
    }

    /// Takes host A's end of the link down.
    fn cut(&self) {
        ip(&["-n", &self.a, "link", "set", &self.link_a, "down"]).expect("cut the link");
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and so
        // the pair.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// The two hosts, or a failure that says why they could not be made.
fn hosts(tag: &str) -> Hosts {
    Hosts::new(tag).unwrap_or_else(|why| {
        panic!("network namespaces are needed here (run as root), but: {why}")
    })
}

#[test]
#[ignore = "needs root (network namespaces): sudo cargo test --release --features fabric -p tensorferry-cli --test netns -- --ignored"]
fn hands_off_across_hosts_and_a_cut_link_fails_in_flight_requests_in_time() {
    let hosts = hosts("x");
    let mut p = Procs::new("netns");
    let results: Vec<String> = (0..3)
        .map(|k| format!("tcp://{A_ADDR}:{}", 5601 + k))
        .collect();
    let push_timeout = Duration::from_secs(4);
    let c = p.spawn(
        "coordinator",
        Hosts::ferry(&hosts.a).args([
            "coordinator",
            "--control",
            "zmq",
            "--listen",
            &results.join(","),
            "--push-timeout-ms",
            &push_timeout.as_millis().to_string(),
            "--alloc-timeout-ms",
            "1000",
            "--done-timeout-ms",
            "3000",
        ]),
    );
    p.wait_for(c, "\"event\":\"ready\"", 30);
    // `ferry instance` of `role`, named `name`, in the namespace `ns` at
    // `addr:port`: the random workload over libfabric's tcp provider from
    // that address.
    let instance = |ns: &str, role: &str, name: &str, coordinator: &str, addr: &str, port: u16| {
        let mut cmd = Hosts::ferry(ns);
        cmd.args(["instance", "--role", role, "--name", name])
            .args(["--coordinator", coordinator])
            .args(["--endpoint", &format!("tcp://{addr}:{port}")])
            .args([
                "--control",
                "zmq",
                "--backend",
                "fabric",
                "--provider",
                "tcp;ofi_rxm",
                "--fabric-source",
                addr,
                "--workload",
                "random",
                "--max-bytes",
                "8388608",
                "--seed",
                "5",
                "--write-timeout-ms",
                "2000",
                "--reserved-timeout-ms",
                "3000",
            ]);
        cmd
    };
    let d = p.spawn(
        "denoiser",
        &mut instance(&hosts.b, "denoiser", "d", &results[1], B_ADDR, 5610),
    );
    p.wait_for(d, "\"event\":\"registered\"", 60);
    let requests = 80;
    let e = p.spawn(
        "encoder",
        instance(&hosts.a, "encoder", "e", &results[0], A_ADDR, 5611)
            .args(["--requests", &requests.to_string(), "--window", "4"])
            .args(["--pace-ms", "40"]),
    );
    p.wait_for(e, "\"event\":\"registered\"", 60);

    // Across the link, every byte checked at the receiver.
    for _ in 0..30 {
        let line = p.wait_for(c, "\"leg\"", 60);
        assert!(line.contains("\"event\":\"delivered\""), "{line}");
    }

    hosts.cut();
    let cut = Instant::now();
    // A request in flight at the cut fails within its timeouts: the write
    // report within the push timeout (the sender's own write timeout is
    // shorter), then the receiver's answer within the alloc timeout.
    let first = p.wait_for(c, "\"event\":\"failed\"", 30);
    let first_after = cut.elapsed();
    assert!(
        first_after <= push_timeout + Duration::from_secs(2),
        "first failure {first_after:?} after the cut: {first}"
    );
    // Every request ends, sent or failed.
    let done = p.wait_for(e, "\"event\":\"encoded\"", 120);
    let (sent, failed) = (num(&done, "sent"), num(&done, "send_failed"));
    eprintln!(
        "cut: first failure after {first_after:?}; all ended after {:?}: {done}",
        cut.elapsed()
    );
    assert_eq!(sent + failed, requests, "{done}");
    assert!(sent >= 30 && failed >= 1, "{done}");

    // Past the receiver's reservation timeout and the coordinator's done
    // timeout, nothing is held anywhere.
    std::thread::sleep(Duration::from_secs(4));
    let s = p.finish(e);
    assert_eq!(num(&s, "requests_held"), 0, "{s}");
    let s = p.finish(d);
    assert_clean(&s, None);
    let s = p.finish(c);
    assert_eq!(num(&s, "in_flight"), 0, "{s}");
    assert_eq!(num(&s, "delivered") + num(&s, "failed"), requests, "{s}");
}
