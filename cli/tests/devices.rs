//! `ferry devices` on this host: the libfabric providers present are
//! listed with what ferry would get from each, and the verbs section either
//! describes the devices or names why there are none (the verb and its
//! errno); over the verbs stand-in device, its GID table and the GID ferry
//! picks, with the reason.

use std::process::Command;

use serde_json::Value;

fn devices(args: &[&str]) -> (Value, String) {
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("devices")
            .args(args)
            .args(extra)
            .env("FI_TCP_IFACE", "lo")
            .output()
            .expect("run ferry devices");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let json: Value = serde_json::from_str(&run(&["--json"])).expect("JSON");
    (json, run(&[]))
}

/// The report's `section`, its array `list` (`what` says what that is),
/// and the text report.
#[cfg(any(feature = "fabric", feature = "verbs"))]
fn listed(section: &str, list: &str, what: &str) -> (Value, Vec<Value>, String) {
    let (report, text) = devices(&[]);
    let section = report[section].clone();
    let items = section[list].as_array().expect(what).clone();
    (section, items, text)
}

#[cfg(feature = "fabric")]
#[test]
fn libfabric_providers_present_are_listed_with_what_ferry_gets() {
    let (lf, offered, text) = listed("libfabric", "offered", "offered providers");
    let has = |name: &str| offered.iter().any(|o| o["provider"] == name);
    // Debian's libfabric 1.17 always has these two (tcp needs no NIC).
    assert!(has("shm") && has("tcp;ofi_rxm"), "{lf}");
    let fit = |name: &str| {
        lf["ferry"]
            .as_array()
            .and_then(|a| a.iter().find(|f| f["provider"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name} not tried: {lf}"))
    };
    for usable in ["shm", "tcp;ofi_rxm"] {
        let f = fit(usable);
        assert_eq!(f["usable"], true, "{f}");
        assert!(f["delivery"].is_string() && f["domain"].is_string(), "{f}");
    }
    let efa = fit("efa");
    if efa["usable"] == false {
        // Why, with the errno of each delivery mode tried.
        let why = efa["why"].as_str().unwrap();
        assert!(why.contains("fi_getinfo") && why.contains("errno"), "{why}");
    }
    assert!(lf["auto"].is_string(), "{lf}");
    assert!(text.contains("--provider auto picks"), "{text}");
}

#[cfg(feature = "verbs")]
#[test]
fn verbs_devices_are_described_or_the_reason_for_none_is_named() {
    let (v, list, text) = listed("verbs", "devices", "a device list");
    if list.is_empty() {
        let why = v["why"].as_str().expect("why there is none");
        assert!(
            why.contains("errno") || why.contains("no RDMA device"),
            "{why}"
        );
        assert!(text.contains("no device: "), "{text}");
    } else {
        for d in list {
            assert!(d.get("error").is_some() || d["gids"].is_array(), "{d}");
        }
    }
}

#[cfg(feature = "verbs-sim")]
#[test]
fn the_stand_in_device_shows_its_gid_table_and_the_chosen_gid_with_the_reason() {
    let (report, text) = devices(&["--verbs-sim"]);
    let d = &report["verbs"]["stand_in"];
    assert_eq!(d["link_layer"], "Ethernet", "{d}");
    assert_eq!(d["gids"].as_array().map(Vec::len), Some(4), "{d}");
    let chosen = &d["chosen_gid"];
    assert_eq!(chosen["index"], 3, "{d}");
    assert_eq!(chosen["type"], "RoCE v2", "{d}");
    assert_eq!(chosen["gid"], "::ffff:127.0.0.1", "{d}");
    assert!(
        chosen["why"].as_str().unwrap().contains("IPv4-mapped"),
        "{d}"
    );
    assert!(
        text.contains("ferry uses GID 3 (::ffff:127.0.0.1)"),
        "{text}"
    );
    // A configured index wins, and one not in the table is refused.
    let (report, _) = devices(&["--verbs-sim", "--gid-index", "1"]);
    let chosen = &report["verbs"]["stand_in"]["chosen_gid"];
    assert_eq!(chosen["index"], 1, "{chosen}");
    assert_eq!(chosen["why"], "configured (--gid-index)", "{chosen}");
    let (report, text) = devices(&["--verbs-sim", "--gid-index", "9"]);
    let err = report["verbs"]["stand_in"]["chosen_gid"]["error"]
        .as_str()
        .unwrap();
    assert!(err.contains("GID index 9 is not in the table"), "{err}");
    assert!(text.contains("no GID fits"), "{text}");
}

#[cfg(not(all(feature = "fabric", feature = "verbs")))]
#[test]
fn a_data_plane_left_out_of_the_build_is_named_as_such() {
    let (report, text) = devices(&[]);
    #[cfg(not(feature = "fabric"))]
    assert_eq!(
        report["libfabric"]["error"],
        "this ferry was built without the `fabric` feature"
    );
    #[cfg(not(feature = "verbs"))]
    assert_eq!(
        report["verbs"]["error"],
        "this ferry was built without the `verbs` feature"
    );
    assert!(text.contains("built without"), "{text}");
}
