//! What a run found ([`Summary`]), and how it is printed: as a table or
//! as one JSON object.

use super::plane_flag;

/// What a run found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// The data plane the bytes moved over (`shared-memory loopback`,
    /// `libfabric shm`, ...).
    pub data_plane: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests that reached the decoder with every byte right.
    pub delivered: u64,
    /// Requests that failed on the way (with the reasons, by leg).
    pub failed: u64,
    /// Failure reasons: (leg, reason) → count.
    pub reasons: Vec<(usize, String, u64)>,
    /// Bytes moved over both legs.
    pub bytes: u64,
    /// Wall time from the first request to the last end.
    pub seconds: f64,
    /// Per leg, from the sender's commit to the receiver holding the data
    /// (the time waiting for a slot included), p50 and p99, µs.
    pub latency_us: [(u64, u64); 2],
    /// Per leg: the waiting and the moving told apart.
    pub legs: [Leg; 2],
    /// Bytes that were not what was sent.
    pub mismatches: u64,
    /// Surviving instances that still hold slots or requests.
    pub leaks: Vec<String>,
    /// Shared-memory objects left behind after cleanup.
    pub shm_left: usize,
    /// Objects that killed processes left, removed by the cleanup.
    pub shm_cleaned: usize,
    /// A process was killed on purpose.
    pub killed: Option<String>,
    /// The run ended before every request did.
    pub incomplete: bool,
}

/// One leg's figures as the coordinator saw them, with memcpy's beside.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Leg {
    /// Waiting for room: `transfer_staged` received to `transfer_push`
    /// sent, a request queued behind others for a free receive slot (and
    /// its allocation round trip, where no slot was set aside); p50 and
    /// p99, µs. `None` where the coordinator reported no timings.
    pub waiting_us: Option<(u64, u64)>,
    /// The hand-off itself: `transfer_push` sent to `transfer_pushed`
    /// received, the write and the two messages around it; p50 and p99,
    /// µs.
    pub moving_us: Option<(u64, u64)>,
    /// Bytes of one request on this leg.
    pub bytes: u64,
    /// A single-thread memcpy of as many bytes, in this run, GB/s.
    pub memcpy_gbps: f64,
}

impl Leg {
    /// The bytes' rate at the hand-off's median, GB/s.
    pub fn gbps(&self) -> Option<f64> {
        self.moving_us
            .map(|(p50, _)| self.bytes as f64 / (p50.max(1) as f64 * 1e3))
    }
}

/// `p50 … µs, p99 … µs`, or what says there is none.
fn pair(p: Option<(u64, u64)>) -> String {
    match p {
        Some((p50, p99)) => format!("p50 {p50} µs, p99 {p99} µs"),
        None => "not reported by this coordinator".to_owned(),
    }
}

impl Summary {
    /// True if the run is what a correct system produces: every request
    /// ended, no byte was wrong, nothing leaked, nothing was left in shared
    /// memory, and requests failed only where a process was killed.
    pub fn ok(&self) -> bool {
        !self.incomplete
            && self.mismatches == 0
            && self.leaks.is_empty()
            && self.shm_left == 0
            && (self.failed == 0 || self.killed.is_some())
            && self.delivered + self.failed == self.requests
    }
}

/// How the summary names the data plane the instances were given.
pub(super) fn data_plane_name(args: &[String]) -> String {
    let value = |flag: &str| plane_flag(args, flag);
    match value("--backend") {
        Some("fabric") => format!("libfabric {}", value("--provider").unwrap_or("auto")),
        Some("verbs") => format!("ibverbs {}", value("--device").unwrap_or("?")),
        None | Some("shm") => "shared-memory loopback".to_owned(),
        Some("local") => "cross-memory attach".to_owned(),
        // A data plane the summary has no words for goes by its name.
        Some(other) => other.to_owned(),
    }
}

/// The summary as a table.
pub fn table(s: &Summary) -> String {
    let mut out = String::new();
    let gbps = s.bytes as f64 / s.seconds / 1e9;
    out.push_str(&format!(
        "pipeline: encoder → denoisers → decoder, separate processes, {}\n",
        s.data_plane
    ));
    out.push_str(&format!("  requests            {}\n", s.requests));
    out.push_str(&format!("  delivered, verified {}\n", s.delivered));
    out.push_str(&format!("  failed              {}\n", s.failed));
    for (leg, reason, n) in &s.reasons {
        out.push_str(&format!("    leg {leg}: {reason} × {n}\n"));
    }
    out.push_str(&format!(
        "  bytes moved         {:.1} MiB in {:.2} s ({gbps:.2} GB/s over the run, waiting included)\n",
        s.bytes as f64 / (1u64 << 20) as f64,
        s.seconds
    ));
    for (leg, name) in ["encoder → denoiser", "denoiser → decoder"]
        .iter()
        .enumerate()
    {
        let l = &s.legs[leg];
        let (p50, p99) = s.latency_us[leg];
        out.push_str(&format!(
            "  {name} ({:.1} MiB a request)\n",
            l.bytes as f64 / (1u64 << 20) as f64
        ));
        out.push_str(&format!(
            "    waiting for room  {}  (staged → push: queued behind others for a free receive slot)\n",
            pair(l.waiting_us)
        ));
        out.push_str(&format!(
            "    hand-off          {}  (push → pushed: the sender's write, after its earlier ones, and its two messages)\n",
            pair(l.moving_us)
        ));
        if let Some(rate) = l.gbps() {
            out.push_str(&format!(
                "    bytes' rate       {rate:.2} GB/s at the hand-off's p50; memcpy {:.2} GB/s (one thread, same size, this run), {:.2} of it\n",
                l.memcpy_gbps,
                rate / l.memcpy_gbps
            ));
        }
        out.push_str(&format!(
            "    commit → received p50 {p50} µs, p99 {p99} µs  (end to end: the waiting, the hand-off, the ready message and the receiver's turn to read it)\n"
        ));
    }
    out.push_str(&format!("  byte mismatches     {}\n", s.mismatches));
    out.push_str(&format!("  slot leaks          {}\n", s.leaks.len()));
    for l in &s.leaks {
        out.push_str(&format!("    {l}\n"));
    }
    if let Some(k) = &s.killed {
        out.push_str(&format!(
            "  killed              {k} (SIGKILL); its {} shared-memory object(s) cleaned\n",
            s.shm_cleaned
        ));
    }
    out.push_str(&format!("  shm objects left    {}\n", s.shm_left));
    if s.incomplete {
        out.push_str("  INCOMPLETE: not every request ended in time\n");
    }
    out.push_str(if s.ok() {
        "  result              ok\n"
    } else {
        "  result              FAILED\n"
    });
    out
}

/// The summary as one JSON object.
pub fn json(s: &Summary) -> String {
    let reasons: Vec<serde_json::Value> = s
        .reasons
        .iter()
        .map(|(l, r, n)| serde_json::json!({"leg": l, "reason": r, "count": n}))
        .collect();
    serde_json::json!({
        "ok": s.ok(),
        "data_plane": s.data_plane,
        "requests": s.requests,
        "delivered": s.delivered,
        "failed": s.failed,
        "reasons": reasons,
        "bytes": s.bytes,
        "seconds": (s.seconds * 1000.0).round() / 1000.0,
        "leg0_p50_us": s.latency_us[0].0,
        "leg0_p99_us": s.latency_us[0].1,
        "leg1_p50_us": s.latency_us[1].0,
        "leg1_p99_us": s.latency_us[1].1,
        "legs": s.legs.iter().map(|l| serde_json::json!({
            "bytes": l.bytes,
            "waiting_p50_us": l.waiting_us.map(|p| p.0),
            "waiting_p99_us": l.waiting_us.map(|p| p.1),
            "handoff_p50_us": l.moving_us.map(|p| p.0),
            "handoff_p99_us": l.moving_us.map(|p| p.1),
            "handoff_gbps": l.gbps().map(|g| (g * 1000.0).round() / 1000.0),
            "memcpy_gbps": (l.memcpy_gbps * 1000.0).round() / 1000.0,
        })).collect::<Vec<_>>(),
        "mismatches": s.mismatches,
        "leaks": s.leaks.len(),
        "shm_left": s.shm_left,
        "shm_cleaned": s.shm_cleaned,
        "killed": s.killed,
        "incomplete": s.incomplete,
    })
    .to_string()
}
