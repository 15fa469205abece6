//! Builds libzmq from the source `zeromq-src` ships, with CURVE, linked
//! against the static libsodium that `libsodium-sys-stable` builds.

use std::path::PathBuf;
use std::process;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let sodium = zeromq_src::LibLocation::new(sodium("LIB"), sodium("INCLUDE"));
    quiet_compiler();
    zeromq_src::Build::new()
        .with_libsodium(Some(sodium))
        .build();
}

/// Where `libsodium-sys-stable` says its library (`LIB`) or headers
/// (`INCLUDE`) are: cargo hands a `links` dependency's metadata to the
/// crates that depend on it as `DEP_SODIUM_*`.
fn sodium(key: &str) -> PathBuf {
    let var = format!("DEP_SODIUM_{key}");
    match std::env::var_os(&var) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        // libsodium-sys-stable names both when it builds libsodium from its
        // bundled source (the default) or finds it with pkg-config; with
        // SODIUM_LIB_DIR it names neither, and libzmq cannot be built with
        // CURVE without libsodium's headers. Say so, rather than panic in
        // the dark.
        _ => {
            eprintln!(
                "error: tensorferry-zmq-sys builds libzmq with CURVE against libsodium, and \
                 libsodium-sys-stable did not say where libsodium's {what} are ({var} is unset). \
                 It says so when it builds libsodium from its bundled source (the default, with \
                 neither SODIUM_LIB_DIR nor SODIUM_USE_PKG_CONFIG set) or when pkg-config finds \
                 libsodium (SODIUM_USE_PKG_CONFIG=1 with libsodium's development package \
                 installed), not under SODIUM_LIB_DIR. Unset SODIUM_LIB_DIR, or use \
                 SODIUM_USE_PKG_CONFIG=1 instead.",
                what = if key == "LIB" {
                    "library files"
                } else {
                    "headers"
                },
            );
            process::exit(1);
        }
    }
}

/// Adds `-w` (no warnings; gcc, clang and MSVC all take it) to the C and
/// C++ flags of this process, which the `cc` crate under `zeromq-src`
/// reads. cc turns every line a compiler prints into a `cargo:warning`,
/// and cargo shows those for path dependencies (a clone of this workspace,
/// or a crate depending on ferry by path): without this, a first
/// `cargo run` prints pages of warnings about libzmq's own code, which the
/// user can do nothing about. Flags the user set are kept; `-w` is added
/// after them, in every variable cc may take them from (it reads the
/// first of `CFLAGS_<target>`, `CFLAGS_<target with underscores>`,
/// `TARGET_CFLAGS` and `CFLAGS` that is set).
fn quiet_compiler() {
    let target = std::env::var("TARGET").unwrap_or_default();
    for var in ["CFLAGS", "CXXFLAGS"] {
        let specific = [
            format!("{var}_{target}"),
            format!("{var}_{}", target.replace('-', "_")),
            format!("TARGET_{var}"),
        ];
        let names = specific
            .iter()
            .filter(|name| std::env::var_os(name).is_some())
            .map(String::as_str)
            .chain([var]);
        for name in names {
            let mut flags = std::env::var_os(name).unwrap_or_default();
            if !flags.is_empty() {
                flags.push(" ");
            }
            flags.push("-w");
            // A build script is one thread until cc starts its own (after
            // this), so nothing reads the environment while it changes.
            std::env::set_var(name, flags);
        }
    }
}
