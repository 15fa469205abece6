//! The `ferry` binary as a user runs it: a real process, real pipes.

use std::io::Write;
use std::process::{Command, Stdio};

fn ferry(args: &[&str], stdin: &[u8]) -> (String, String, bool) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferry");
    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || input.write_all(&data));
    let out = child.wait_with_output().expect("wait for ferry");
    writer.join().expect("writer thread").expect("write stdin");
    (
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// Runs `ferry args` as [`ferry`] does and returns its stdout, asserting
/// that it succeeded (its stderr names why not).
fn ferry_ok(args: &[&str], stdin: &[u8]) -> String {
    let (out, err, ok) = ferry(args, stdin);
    assert!(ok, "{err}");
    out
}

fn golden(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/../tests/data/golden/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("golden file")
}

#[test]
fn canon_reproduces_the_seeds_encoding_line_for_line() {
    let out = ferry_ok(&["wire", "canon"], &golden("loose.jsonl"));
    let want = String::from_utf8(golden("loose.canonical.jsonl")).unwrap();
    assert_eq!(out.lines().count(), want.lines().count());
    for (i, (got, want)) in out.lines().zip(want.lines()).enumerate() {
        assert_eq!(got, want, "line {}", i + 1);
    }
}

#[test]
fn canon_reports_bad_lines_and_keeps_going() {
    let input = b"{\"msg_type\":\"transfer_done\",\"request_id\":\"a\"}\n\
        not json\n\
        {\"msg_type\":\"transfer_push\",\"dest_addr\":-4}\n\
        \xff\xfe\n\
        \n\
        {\"msg_type\":\"transfer_alloc\",\"data_size\":18446744073709551616}\n\
        {\"request_id\":\"r\"}\n\
        {\"msg_type\":\"transfer_done\",\"request_id\":\"b\"}";
    let out = ferry_ok(&["wire", "canon"], input);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    assert_eq!(
        lines[0],
        r#"{"msg_type":"transfer_done","request_id":"a","error":null}"#
    );
    let errors = [
        "error: invalid JSON",
        "error: field `dest_addr`: negative",
        "error: invalid JSON: not valid UTF-8",
        "error: invalid JSON: unexpected end",
        "error: field `data_size`: integer larger",
        "error: field `msg_type`: missing",
    ];
    for (line, error) in lines[1..7].iter().zip(errors) {
        assert!(line.starts_with(error), "{line}");
    }
    assert_eq!(
        lines[7],
        r#"{"msg_type":"transfer_done","request_id":"b","error":null}"#
    );
}

#[test]
fn decode_describes_messages_for_people() {
    let input = b"{\"msg_type\":\"transfer_register\",\"role\":\"denoiser\",\"session_id\":\"s\",\"pool_ptr\":4096,\"pool_size\":1073741824,\"preallocated_slots\":[{\"offset\":0,\"size\":16777216,\"slot_id\":3,\"addr\":4096}]}\n\
        {\"msg_type\":\"transfer_pushed\",\"request_id\":\"r\",\"success\":false,\"error\":\"EIO\"}\n\
        [1]\n";
    let out = ferry_ok(&["wire", "decode"], input);
    assert!(out.contains("transfer_register\n"), "{out}");
    assert!(out.contains("1073741824 (1.00 GiB)"), "{out}");
    assert!(out.contains("slot 3"), "{out}");
    assert!(out.contains("success             false"), "{out}");
    assert!(out.contains("\"EIO\""), "{out}");
    assert!(
        out.contains("line 3: error: message must be a JSON object, got array"),
        "{out}"
    );
}

#[test]
fn bench_wire_prints_the_seeds_payloads() {
    let out = ferry_ok(&["bench", "wire", "--print-payloads"], b"");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].starts_with(r#"{"msg_type":"transfer_staged","#));
    assert!(lines[1].starts_with(r#"{"msg_type":"transfer_push","#));
}

#[test]
fn bench_wire_rejects_a_bad_duration() {
    let (_, err, ok) = ferry(&["bench", "wire", "--seconds", "0"], b"");
    assert!(!ok);
    assert!(err.contains("--seconds must be a positive number"), "{err}");
}

#[test]
fn bench_runs_hand_offs_and_control_round_trips_between_real_processes() {
    // Functional only (timing belongs to the benchmark itself): both
    // commands complete and report every size and transport.
    let runs: [(&[&str], [&str; 2]); 2] = [
        (
            &["bench", "--seconds", "0.05", "--sizes", "4K,1M", "--json"],
            ["\"size\":4096", "\"size\":1048576"],
        ),
        (
            &["bench", "--control", "zmq", "--seconds", "0.05", "--json"],
            ["\"ipc\":{", "\"tcp\":{"],
        ),
    ];
    for (args, wants) in runs {
        let out = ferry_ok(args, b"");
        for want in wants {
            assert!(out.contains(want), "{args:?}: no {want} in {out}");
        }
    }
    let (_, err, ok) = ferry(&["bench", "--control", "carrier-pigeon"], b"");
    assert!(!ok && err.contains("carrier-pigeon"), "{err}");
}

#[test]
fn bench_runs_the_hand_off_rig_over_the_plane_it_is_given() {
    // Any data plane by its name: the local plane (cross-memory attach)
    // has no arm of its own in `ferry bench`, and reports its rows, its
    // name and its control channel.
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--backend", "local", "--sizes", "4K"];
        args.extend(["--seconds", "0.2"]);
        args.extend(extra);
        ferry(&args, b"")
    };
    let (out, err, ok) = bench(&[]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains("over the local data plane") && lines[0].contains("Unix sockets"),
        "{out}"
    );
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[2].trim_start().starts_with("4 KiB"), "{out}");
    // --copy-threads is the plane's `threads` option.
    let (out, err, ok) = bench(&["--copy-threads", "2", "--json"]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(report["plane"], "local", "{out}");
    assert_eq!(report["control"], "unix", "{out}");
    assert_eq!(report["options"]["threads"], "2", "{out}");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["size"], 4096, "{out}");
    assert!(rows[0]["iterations"].as_u64() > Some(0), "{out}");
    assert!(rows[0]["p50_us"].as_f64() > Some(0.0), "{out}");
}
