//! `ferry devices`: what this host offers the data planes, and what ferry
//! would choose. Built as one JSON document (serde_json), printed as is
//! with `--json` or rendered as text.

use serde_json::{json, Value};

/// What `ferry devices` was asked.
#[derive(clap::Args, Debug)]
pub struct DevicesArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The verbs port to describe on each device.
    #[arg(long, env = "FERRY_VERBS_PORT", default_value_t = 1)]
    pub ib_port: u8,
    /// A configured GID index, as `--gid-index` of an instance.
    #[arg(long, env = "FERRY_GID_INDEX")]
    pub gid_index: Option<u8>,
    /// Describe the verbs tests' software stand-in device as well (builds
    /// with the `verbs-sim` feature).
    #[arg(long, hide = true)]
    pub verbs_sim: bool,
}

/// The whole report.
pub fn report(args: &DevicesArgs) -> Value {
    json!({
        "libfabric": libfabric(),
        "verbs": verbs(args),
    })
}

#[cfg(not(feature = "fabric"))]
fn libfabric() -> Value {
    json!({"error": "this ferry was built without the `fabric` feature"})
}

#[cfg(feature = "fabric")]
fn libfabric() -> Value {
    use tensorferry_fabric::listing;
    let offered = match listing::offered() {
        Ok(list) => Value::Array(
            list.into_iter()
                .map(|o| json!({"provider": o.provider, "fabric": o.fabric, "domain": o.domain}))
                .collect(),
        ),
        Err(e) => json!({"error": e.to_string()}),
    };
    let fits = listing::fits();
    let auto = listing::auto_choice(&fits).map(|f| f.provider);
    let ferry: Vec<Value> = fits
        .iter()
        .map(|f| match &f.result {
            Ok(u) => json!({
                "provider": f.provider,
                "usable": true,
                "delivery": u.delivery.as_str(),
                "fabric": u.fabric,
                "domain": u.domain,
                "max_msg_size": u.max_msg_size,
                "cq_data_size": u.cq_data_size,
                "mr_mode": u.mr_mode,
            }),
            Err(why) => json!({"provider": f.provider, "usable": false, "why": why}),
        })
        .collect();
    json!({
        "offered": offered,
        "ferry": ferry,
        "auto": auto,
        "auto_order": tensorferry_fabric::provider::AUTO_ORDER,
    })
}

#[cfg(not(feature = "verbs"))]
fn verbs(_args: &DevicesArgs) -> Value {
    json!({"error": "this ferry was built without the `verbs` feature"})
}

#[cfg(feature = "verbs")]
fn verbs(args: &DevicesArgs) -> Value {
    use tensorferry_verbs::report;
    let choice = args.gid_index.map_or(
        tensorferry_verbs::GidChoice::Auto,
        tensorferry_verbs::GidChoice::Index,
    );
    let mut out = match report::host(args.ib_port, choice) {
        Ok(devices) if devices.is_empty() => {
            json!({"devices": [], "why": "libibverbs lists no RDMA device on this host"})
        }
        Ok(devices) => json!({
            "devices": devices
                .into_iter()
                .map(|(name, r)| match r {
                    Ok(r) => port_json(&r),
                    Err(e) => json!({"device": name, "error": e.to_string()}),
                })
                .collect::<Vec<_>>(),
        }),
        Err(why) => json!({"devices": [], "why": why}),
    };
    #[cfg(feature = "verbs-sim")]
    if args.verbs_sim {
        let dev = tensorferry_verbs::sim::SimDevice::new([127, 0, 0, 1], 1 << 30);
        out["stand_in"] = port_json(&report::describe(&dev, choice));
    }
    #[cfg(not(feature = "verbs-sim"))]
    if args.verbs_sim {
        out["stand_in"] = json!({"error": "this ferry was built without the `verbs-sim` feature"});
    }
    out
}

#[cfg(feature = "verbs")]
fn port_json(r: &tensorferry_verbs::report::PortReport) -> Value {
    use tensorferry_verbs::device::{GidKind, LinkLayer};
    use tensorferry_verbs::gid::gid_text;
    let kind = |k: GidKind| match k {
        GidKind::InfiniBand => "IB".to_owned(),
        GidKind::RoceV1 => "RoCE v1".to_owned(),
        GidKind::RoceV2 => "RoCE v2".to_owned(),
        GidKind::Other(n) => format!("type {n}"),
    };
    let gids: Vec<Value> = r
        .gids
        .iter()
        .map(|g| json!({"index": g.index, "gid": gid_text(&g.gid), "type": kind(g.kind)}))
        .collect();
    let chosen = match &r.chosen {
        Ok((g, why)) => {
            json!({"index": g.index, "gid": gid_text(&g.gid), "type": kind(g.kind), "why": why})
        }
        Err(why) => json!({"error": why}),
    };
    json!({
        "device": r.port.device,
        "port": r.port.port,
        "link_layer": match r.port.link {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
        },
        "lid": r.port.lid,
        "active_mtu": r.port.active_mtu,
        "max_msg": r.port.max_msg,
        "gids": gids,
        "chosen_gid": chosen,
    })
}

/// The report as text for a person.
pub fn text(report: &Value) -> String {
    let mut out = String::new();
    let s = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    out.push_str("libfabric\n");
    let lf = &report["libfabric"];
    if let Some(e) = lf.get("error") {
        out.push_str(&format!("  {}\n", s(e)));
    } else {
        out.push_str("  offered here:\n");
        match &lf["offered"] {
            Value::Array(list) if list.is_empty() => out.push_str("    nothing\n"),
            Value::Array(list) => {
                for o in list {
                    out.push_str(&format!(
                        "    {:<16} fabric {:<20} domain {}\n",
                        s(&o["provider"]),
                        s(&o["fabric"]),
                        s(&o["domain"])
                    ));
                }
            }
            other => out.push_str(&format!("    {}\n", s(&other["error"]))),
        }
        out.push_str(
            "  what ferry needs (reliable datagrams, RMA writes both ways, thread safety):\n",
        );
        for f in lf["ferry"].as_array().into_iter().flatten() {
            if f["usable"] == Value::Bool(true) {
                let max = match f["max_msg_size"].as_u64() {
                    Some(u64::MAX) => "no limit".to_owned(),
                    Some(n) => format!("{n} B"),
                    None => "?".to_owned(),
                };
                out.push_str(&format!(
                    "    {:<16} usable: {}, domain {}, max message {max}\n",
                    s(&f["provider"]),
                    s(&f["delivery"]),
                    s(&f["domain"]),
                ));
            } else {
                out.push_str(&format!(
                    "    {:<16} not usable: {}\n",
                    s(&f["provider"]),
                    s(&f["why"])
                ));
            }
        }
        match lf["auto"].as_str() {
            Some(p) => out.push_str(&format!("  --provider auto picks {p}\n")),
            None => {
                out.push_str("  --provider auto finds none of efa, verbs;ofi_rxm, tcp;ofi_rxm\n")
            }
        }
    }
    out.push_str("verbs\n");
    let v = &report["verbs"];
    if let Some(e) = v.get("error") {
        out.push_str(&format!("  {}\n", s(e)));
    }
    if let Some(why) = v.get("why") {
        out.push_str(&format!("  no device: {}\n", s(why)));
    }
    let stand_in = v.get("stand_in").into_iter();
    for d in v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(stand_in)
    {
        if let Some(e) = d.get("error") {
            out.push_str(&format!("  {}: {}\n", s(&d["device"]), s(e)));
            continue;
        }
        out.push_str(&format!(
            "  {} port {}: {}, LID {}, MTU {}, max message {} B\n",
            s(&d["device"]),
            s(&d["port"]),
            s(&d["link_layer"]),
            s(&d["lid"]),
            s(&d["active_mtu"]),
            s(&d["max_msg"])
        ));
        for g in d["gids"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "    GID {:>3} {:<40} {}\n",
                s(&g["index"]),
                s(&g["gid"]),
                s(&g["type"])
            ));
        }
        let c = &d["chosen_gid"];
        match c.get("error") {
            Some(e) => out.push_str(&format!("    no GID fits: {}\n", s(e))),
            None => out.push_str(&format!(
                "    ferry uses GID {} ({}): {}\n",
                s(&c["index"]),
                s(&c["gid"]),
                s(&c["why"])
            )),
        }
    }
    out
}
