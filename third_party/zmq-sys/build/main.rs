// ferry's copy: libzmq is built with CURVE against the libsodium that
// `libsodium-sys-stable` builds from its bundled source (see Cargo.toml).
use std::path::PathBuf;

pub fn configure() {
    println!("cargo:rerun-if-changed=build/main.rs");
    println!("cargo:rerun-if-env-changed=PROFILE");

    let dep = |key: &str| {
        std::env::var_os(format!("DEP_SODIUM_{}", key))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("libsodium-sys-stable did not say where its {} is", key))
    };
    let sodium = zeromq_src::LibLocation::new(dep("LIB"), dep("INCLUDE"));
    zeromq_src::Build::new()
        .with_libsodium(Some(sodium))
        .build();
}

fn main() {
    configure()
}
