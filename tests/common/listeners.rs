//! What a process listens on, read from `/proc`, and the book's endpoint
//! table (docs/src/operating.md, "Endpoints the processes open") it is
//! checked against: shared by the endpoint tests of the CLI's processes
//! and of the runtime's nodes.
#![allow(dead_code)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

/// The endpoint table of the book at `root` (the workspace's root): each
/// row's process (as the table names it, without its data plane) and
/// endpoint.
pub fn book(root: &Path) -> HashSet<(String, String)> {
    let text = std::fs::read_to_string(root.join("docs/src/operating.md")).unwrap();
    let table = text
        .split("### Endpoints the processes open")
        .nth(1)
        .expect("the book has its endpoint table");
    let mut rows = HashSet::new();
    for line in table.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(process), Some(endpoint)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let name = |cell: &str| {
            cell.split('`')
                .nth(1)
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let (process, endpoint) = (name(process), name(endpoint));
        if !process.is_empty() && !endpoint.is_empty() {
            rows.insert((process, endpoint));
        }
    }
    assert!(
        rows.len() >= 10,
        "the endpoint table has {} rows",
        rows.len()
    );
    rows
}

/// The inodes of the sockets process `pid` holds.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// An address as /proc/net/tcp{,6} writes it (hex, in the host's order).
pub fn proc_address(hex: &str) -> Option<SocketAddr> {
    let (ip, port) = hex.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip: std::net::IpAddr = match ip.len() {
        8 => {
            // The address's bytes, read as a host-order u32.
            let v = u32::from_str_radix(ip, 16).ok()?;
            std::net::Ipv4Addr::from(v.to_ne_bytes()).into()
        }
        32 => {
            let mut b = [0u8; 16];
            for (i, w) in b.chunks_mut(4).enumerate() {
                let v = u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).ok()?;
                w.copy_from_slice(&v.to_ne_bytes());
            }
            std::net::Ipv6Addr::from(b).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Every socket process `pid` listens on: TCP (v4 and v6) by address, and
/// Unix ones by path.
pub fn listening(pid: u32) -> (Vec<SocketAddr>, Vec<String>) {
    let mine = socket_inodes(pid);
    let mut tcp = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st ... inode (the 10th field)
            if f.len() > 9 && f[3] == "0A" {
                let inode: u64 = f[9].parse().unwrap_or(0);
                if mine.contains(&inode) {
                    tcp.push(proc_address(f[1]).unwrap());
                }
            }
        }
    }
    let mut unix = Vec::new();
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/unix")) {
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode Path; a listening
            // socket has __SO_ACCEPTCON (0x10000) in its flags.
            if f.len() >= 7 {
                let flags = u32::from_str_radix(f[3], 16).unwrap_or(0);
                let inode: u64 = f[6].parse().unwrap_or(0);
                if flags & 0x10000 != 0 && mine.contains(&inode) {
                    unix.push(f.get(7).map_or_else(String::new, |p| (*p).to_owned()));
                }
            }
        }
    }
    (tcp, unix)
}
