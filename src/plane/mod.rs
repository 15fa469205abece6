//! Every data plane, by one type: [`DataPlane`] names them, reads their
//! options, opens a transfer engine on one and starts a node on one. The
//! engine ([`TransferEngine::open`](crate::engine::TransferEngine::open)),
//! the nodes ([`DataPlane::start_instance`]), the CLI (`--backend NAME
//! --plane-option KEY=VALUE`), the Python module (`backend=NAME,
//! **options`) and the benchmarks all choose a data plane by this type
//! and its names:
//!
//! * `local`: processes on one host, by cross-memory attach (any memory
//!   a process registers; a node's pool is anonymous memory);
//! * `shm`: pools in POSIX shared memory, for a node's processes on one
//!   host (a pool is the node's own, so no engine);
//! * `fabric`: libfabric (EFA, verbs, tcp, shm providers);
//! * `verbs`: an RDMA device port (ibverbs RC queue pairs);
//! * `auto`: verbs on the host's first RDMA device if this build has the
//!   plane and the host a device, else `local`.
//! * `delay` (for tests): another plane whose every write completion is
//!   held back by a fixed delay, to see how a deployment fares on a
//!   slower fabric; nodes only.
//!
//! # Adding a data plane
//!
//! A plane `foo` is one module, `foo.rs` here, whose marker type
//! implements `Spec` (its name, its options and their parser, how its
//! transport opens for a node and for an engine, what it binds behind the
//! node's guard), and one line in the `planes!` list below, which makes
//! its [`DataPlane`] variant and every dispatch. If its transport lives in
//! a crate of its own, that crate is a dependency (with a feature, if
//! optional) in the root `Cargo.toml`. The CLI, Python and `ferry bench`
//! name no plane: they reach it by its name and options.

mod any;
mod options;

mod delay;
#[cfg(feature = "fabric")]
mod fabric;
mod local;
mod shm;
#[cfg(feature = "verbs")]
mod verbs;

use tensorferry_core::transport::{PoolOwner, Transport};
use tensorferry_shm::UdsChannel;
use tensorferry_zmq::Guard;

use crate::runtime::InstanceChannel;

pub use any::{AnyTransport, AnyTransportError};
pub use delay::DelayConfig;
pub use options::PlaneError;
pub use shm::CopyConfig;
pub use tensorferry_local::LocalConfig;

use crate::engine::{EngineConfig, EngineError, TransferEngine};
use crate::runtime::{InstanceNode, InstanceNodeConfig, NodeError};
use options::Options;

/// What a data plane's module says about it: how it is named, read from
/// options, opened for a node and for a transfer engine. One per plane,
/// listed in `planes!`.
trait Spec {
    /// Its name (`--backend NAME`, `backend=NAME`).
    const NAME: &'static str;
    /// The options it takes.
    const OPTIONS: &'static [&'static str];
    /// What the options are read into.
    type Config: Clone + std::fmt::Debug;
    /// Its transport for a node: one that owns the node's pool.
    type Node: Transport<Error = Self::NodeError> + PoolOwner + Send + 'static;
    /// Its node transport's error.
    type NodeError: std::error::Error + Send + Sync + 'static;
    /// Its transport for an engine: registers the application's memory.
    type Engine: Transport + Send + 'static;

    /// Reads the options given (each once; leftovers are refused by
    /// [`Options::finish`]).
    fn parse(given: Options) -> Result<Self::Config, PlaneError>;

    /// Its transport with a new pool of `pool_len` bytes.
    fn open_node(config: &Self::Config, pool_len: usize) -> Result<Self::Node, NodeError>;

    /// Its transport for an engine guarded by `guard`, or why it cannot
    /// serve one.
    fn open_engine(config: Self::Config, guard: &Guard) -> Result<Self::Engine, EngineError>;

    /// Puts what it binds for its peers behind the node's `guard`.
    fn guard(config: &mut Self::Config, guard: &Guard) {
        let _ = (config, guard);
    }

    /// True if its peers may be on other hosts.
    fn reaches_other_hosts(config: &Self::Config) -> bool;

    /// True if its nodes pair with the ZeroMQ control plane only (the
    /// default: if its peers may be on other hosts, which Unix sockets do
    /// not reach).
    fn needs_zmq(config: &Self::Config) -> bool {
        Self::reaches_other_hosts(config)
    }
}

/// Declares [`DataPlane`] with a variant per plane, and every dispatch
/// over it, from one list: `Variant(Config) by module::Spec`, its doc and
/// its `cfg` first.
macro_rules! planes {
    ($($(#[doc = $doc:expr])* $(#[cfg(feature = $feature:literal)])? $variant:ident($config:ty) by $($spec:ident)::+,)+) => {
        /// A data plane with its settings (see the [module](self)).
        #[derive(Clone, Debug)]
        #[non_exhaustive]
        pub enum DataPlane {
            $($(#[doc = $doc])* $(#[cfg(feature = $feature)])? $variant($config),)+
        }

        /// The data planes this build has, by name.
        const NAMES: &[&str] = &[$($(#[cfg(feature = $feature)])? <$($spec)::+ as Spec>::NAME,)+];

        /// The data planes behind a Cargo feature that this build left
        /// out, by name: a plane behind a feature is named as its feature
        /// (a test checks it of those built).
        const LEFT_OUT: &[&str] = &[$($(#[cfg(not(feature = $feature))] $feature,)?)+];

        /// The data planes behind a Cargo feature that this build has, by
        /// their feature (each is also a name in [`NAMES`]).
        #[cfg(test)]
        const FEATURED: &[&str] = &[$($(#[cfg(feature = $feature)] $feature,)?)+];

        impl DataPlane {
            /// The options the data plane `name` takes, if this build has
            /// it (`auto` takes those of the plane it picks: see
            /// [`DataPlane::resolve`]; none are listed for it here).
            pub fn options_of(name: &str) -> Option<&'static [&'static str]> {
                $($(#[cfg(feature = $feature)])? if name == <$($spec)::+ as Spec>::NAME {
                    return Some(<$($spec)::+ as Spec>::OPTIONS);
                })+
                (name == AUTO).then_some(&[])
            }

            fn parse_named(name: &str, given: Options) -> Result<Self, PlaneError> {
                $($(#[cfg(feature = $feature)])? if name == <$($spec)::+ as Spec>::NAME {
                    return <$($spec)::+ as Spec>::parse(given).map(Self::$variant);
                })+
                Err(unknown(name))
            }

            /// Its name.
            pub fn name(&self) -> &'static str {
                match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(_) => <$($spec)::+ as Spec>::NAME,)+
                }
            }

            /// True if its peers may be on other hosts.
            pub fn reaches_other_hosts(&self) -> bool {
                match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(c) => <$($spec)::+ as Spec>::reaches_other_hosts(c),)+
                }
            }

            /// True if its nodes pair with the ZeroMQ control plane only,
            /// as each plane decides (its spec's `needs_zmq`): those whose
            /// peers may be on other hosts, and libfabric whatever its
            /// provider. A plane of one host pairs with Unix sockets as
            /// well.
            pub fn needs_zmq(&self) -> bool {
                match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(c) => <$($spec)::+ as Spec>::needs_zmq(c),)+
                }
            }

            /// Puts what this data plane binds for its peers behind the
            /// node's `guard`, as the node's control endpoints are: the
            /// verbs side channel takes its allow-list and, with CURVE, its
            /// key (and admits the plane's `writers`). The others bind
            /// nothing of theirs the guard could reach (libfabric's
            /// providers listen on their own; see the book's security
            /// chapter).
            pub fn guard(&mut self, guard: &Guard) {
                match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(c) => <$($spec)::+ as Spec>::guard(c, guard),)+
                }
            }

            /// Opens its transport with a new pool of `pool_len` bytes, behind
            /// one type (for a caller that wraps it: see
            /// [`start_instance_with`](Self::start_instance_with)).
            pub fn open(&self, pool_len: usize) -> Result<AnyTransport, NodeError> {
                Ok(match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(c) => {
                        AnyTransport::new(<$($spec)::+ as Spec>::open_node(c, pool_len)?)
                    })+
                })
            }

            /// Starts an instance on this data plane with a new pool of
            /// `pool_len` bytes, talking over `channel`.
            pub fn start_instance<C>(
                &self,
                settings: &InstanceNodeConfig,
                pool_len: usize,
                channel: C,
            ) -> Result<InstanceNode, NodeError>
            where
                C: InstanceChannel,
            {
                // Each transport by its own type, so that the progress loop
                // calls it directly.
                match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(c) => InstanceNode::start(
                        settings,
                        <$($spec)::+ as Spec>::open_node(c, pool_len)?,
                        channel,
                    ),)+
                }
            }

            /// A transfer engine on this data plane, set up as `config`
            /// says ([`TransferEngine::open_with`]).
            pub(crate) fn open_engine(
                self,
                config: EngineConfig,
            ) -> Result<TransferEngine, EngineError> {
                let name = self.name();
                let guard = match config.guard {
                    Some(g) => g,
                    None => Guard::from_env()?,
                };
                // Peers on this host only: loopback is where they reach it.
                let host = config.notify_host.unwrap_or_else(|| {
                    if self.reaches_other_hosts() {
                        crate::engine::this_host()
                    } else {
                        "127.0.0.1".into()
                    }
                });
                match self {
                    $($(#[cfg(feature = $feature)])? Self::$variant(c) => TransferEngine::start(
                        <$($spec)::+ as Spec>::open_engine(c, &guard)?,
                        name,
                        &host,
                        &guard,
                    ),)+
                }
            }
        }
    };
}

planes! {
    /// Processes on one host, by cross-memory attach
    /// (`process_vm_writev`): an engine's registered memory, or a node's
    /// pool of anonymous memory.
    Local(LocalConfig) by local::Local,
    /// Pools in POSIX shared memory, for a node's processes on one host.
    Shm(CopyConfig) by shm::Shm,
    /// A libfabric provider (EFA, verbs, tcp, shm). An engine asks for
    /// delivery-complete writes whatever `delivery` says.
    #[cfg(feature = "fabric")]
    Fabric(tensorferry_fabric::FabricConfig) by fabric::Fabric,
    /// An RDMA device port (ibverbs RC queue pairs).
    #[cfg(feature = "verbs")]
    Verbs(tensorferry_verbs::VerbsConfig) by verbs::Verbs,
    /// For tests: another plane whose every write completion is held
    /// back by a fixed delay (how a deployment fares on a slower fabric).
    /// Nodes only.
    Delay(DelayConfig) by delay::Delay,
}

/// The name that picks the best data plane present ([`DataPlane::auto`]).
pub const AUTO: &str = "auto";

impl Default for DataPlane {
    /// Shared memory with its default copy settings: a node's plane when
    /// none is named.
    fn default() -> Self {
        Self::Shm(CopyConfig::default())
    }
}

impl DataPlane {
    /// The names of the data planes this build has (and [`AUTO`], which
    /// picks one of them).
    pub fn names() -> &'static [&'static str] {
        NAMES
    }

    /// The best data plane present: an RDMA NIC's verbs when this build
    /// has them and the host has a device, else `local` (which reaches
    /// processes on this host only).
    pub fn auto() -> Self {
        #[cfg(feature = "verbs")]
        if let Ok(names) = tensorferry_verbs::device_names() {
            if let Some(first) = names.into_iter().next() {
                return Self::Verbs(tensorferry_verbs::VerbsConfig::new(first));
            }
        }
        Self::Local(LocalConfig::default())
    }

    /// The data plane `name` (or [`AUTO`]) with `options` (key, value)
    /// applied, each read once; an option it does not take, or a value it
    /// cannot, is an error naming it. Durations read as `250ms`, `5s`,
    /// `100us` or bare seconds; sizes in bytes. Each plane's module
    /// documents its options ([`DataPlane::options_of`] lists them):
    ///
    /// * `local`: `threads` (copy threads for a large transfer),
    ///   `split_at` (bytes from which one is split over them);
    /// * `shm`: `threads`, `split_at`, as `local`'s;
    /// * `fabric`: `provider` (`auto`, or a libfabric name such as
    ///   `tcp;ofi_rxm`), `delivery` (`auto`, `delivery-complete`,
    ///   `remote-cq-data`), `source` (an address of this host),
    ///   `max_chunk`, `write_timeout`;
    /// * `verbs`: `device` (needed), `port`, `gid_index`, `listen` (the
    ///   side channel's address), `max_chunk`, `write_timeout`, `writers`
    ///   (the CURVE certificates of the instances that may write into
    ///   this one: a directory of `*.key` files, or one);
    /// * `delay`: `over` (the plane it wraps, with its default options;
    ///   default `shm`), `delay` (default 1 ms).
    pub fn parse<K, V>(
        name: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, PlaneError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        if name == AUTO {
            return Self::parse_auto(options);
        }
        let takes = Self::options_of(name).ok_or_else(|| unknown(name))?;
        Self::parse_named(name, Options::new(static_name(name), takes, options))
    }

    /// The plane [`AUTO`] picks, with `options` read as that plane's
    /// (verbs on the device it found, unless one is named).
    fn parse_auto<K, V>(options: impl IntoIterator<Item = (K, V)>) -> Result<Self, PlaneError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let chosen = Self::auto();
        let name = chosen.name();
        let takes = Self::options_of(name).unwrap_or(&[]);
        #[cfg_attr(not(feature = "verbs"), allow(unused_mut))]
        let mut given: Vec<(String, String)> = options
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        #[cfg(feature = "verbs")]
        if let Self::Verbs(c) = &chosen {
            if !given.iter().any(|(k, _)| k == "device") {
                given.push(("device".to_owned(), c.device.clone()));
            }
        }
        Self::parse_named(name, Options::new(name, takes, given))
    }

    /// The name of the plane `name` stands for: what [`AUTO`] picks on
    /// this host, else `name` itself (for a caller that passes options by
    /// the plane they will reach).
    pub fn resolve(name: &str) -> &str {
        if name == AUTO {
            Self::auto().name()
        } else {
            name
        }
    }

    /// Starts an instance on this data plane with a new pool of `pool_len`
    /// bytes, listening on a Unix-socket control channel at `endpoint`
    /// (`ipc://<path>`): the default for processes on one host.
    pub fn start_instance_at(
        &self,
        settings: &InstanceNodeConfig,
        pool_len: usize,
        endpoint: &str,
    ) -> Result<InstanceNode, NodeError> {
        let channel = UdsChannel::bind(endpoint)
            .map_err(|e| NodeError::transport("bind control endpoint", e.kind(), e))?;
        self.start_instance(settings, pool_len, channel)
    }

    /// Like [`start_instance`](Self::start_instance), with the transport
    /// handed to `wrap` first (a fault injector, say). What `wrap` returns
    /// must own the transport it was given (it is a [`PoolOwner`], as
    /// [`AnyTransport`] is), so the node's pool lives as long as the node.
    pub fn start_instance_with<C, W>(
        &self,
        settings: &InstanceNodeConfig,
        pool_len: usize,
        channel: C,
        wrap: impl FnOnce(AnyTransport) -> W,
    ) -> Result<InstanceNode, NodeError>
    where
        C: InstanceChannel,
        W: Transport + PoolOwner + Send + 'static,
        W::Error: Send + Sync + 'static,
    {
        InstanceNode::start(settings, wrap(self.open(pool_len)?), channel)
    }
}

/// The error for a name this build does not have: a plane it left out
/// (which says the Cargo feature that builds it), or no plane at all.
fn unknown(name: &str) -> PlaneError {
    match LEFT_OUT.iter().find(|left| **left == name) {
        Some(feature) => PlaneError::NotBuilt {
            name: feature,
            feature,
        },
        None => PlaneError::Unknown {
            name: name.to_owned(),
            available: NAMES,
        },
    }
}

/// `name` as the static name of the data plane it is (one of [`NAMES`],
/// or [`AUTO`]).
fn static_name(name: &str) -> &'static str {
    NAMES.iter().copied().find(|n| *n == name).unwrap_or(AUTO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plane_behind_a_feature_is_named_as_it_and_one_left_out_says_so() {
        for feature in FEATURED {
            assert!(NAMES.contains(feature), "{feature} is no plane's name");
        }
        for left in LEFT_OUT {
            let none: [(&str, &str); 0] = [];
            let e = DataPlane::parse(left, none).unwrap_err();
            assert_eq!(
                e,
                PlaneError::NotBuilt {
                    name: left,
                    feature: left
                }
            );
            assert!(e.to_string().contains(&format!("`{left}`")), "{e}");
        }
        for plane in ["fabric", "verbs"] {
            assert!(
                FEATURED.contains(&plane) != LEFT_OUT.contains(&plane),
                "{plane}"
            );
        }
    }

    #[test]
    fn every_name_parses_to_itself() {
        for name in DataPlane::names() {
            let options: &[(&str, &str)] = if *name == "verbs" {
                &[("device", "rxe0")]
            } else {
                &[]
            };
            let plane = DataPlane::parse(name, options.iter().copied()).unwrap();
            assert_eq!(plane.name(), *name);
            assert!(DataPlane::options_of(name).is_some());
        }
    }

    #[test]
    fn auto_is_a_plane_this_build_has_and_takes_its_options() {
        let none: [(&str, &str); 0] = [];
        let plane = DataPlane::parse(AUTO, none).unwrap();
        assert!(DataPlane::names().contains(&plane.name()), "{plane:?}");
        assert_eq!(DataPlane::resolve(AUTO), plane.name());
        assert_eq!(DataPlane::resolve("shm"), "shm");
        let e = DataPlane::parse(AUTO, [("colour", "red")]).unwrap_err();
        let named = format!("the {} data plane takes no option \"colour\"", plane.name());
        assert!(e.to_string().contains(&named), "{e}");
        // Without an RDMA device, auto is local, and takes its options.
        if plane.name() == "local" {
            let plane = DataPlane::parse(AUTO, [("threads", "2")]).unwrap();
            let DataPlane::Local(c) = plane else {
                panic!("not local: {plane:?}");
            };
            assert_eq!(c.threads, 2);
        }
    }

    #[test]
    fn the_engine_refuses_what_it_would_ignore_or_cannot_serve() {
        let open = |plane: DataPlane| {
            let config = EngineConfig {
                guard: Some(Guard::default()),
                ..EngineConfig::default()
            };
            TransferEngine::open_with(plane, config)
                .unwrap_err()
                .to_string()
        };
        let none: [(&str, &str); 0] = [];
        let e = open(DataPlane::parse("shm", none).unwrap());
        assert!(
            e.contains("shm data plane cannot serve") && e.contains("local"),
            "{e}"
        );
        #[cfg(feature = "fabric")]
        {
            let plane = DataPlane::parse("fabric", [("delivery", "remote-cq-data")]).unwrap();
            let e = open(plane);
            assert!(e.contains("delivery=remote-cq-data is a node's"), "{e}");
        }
        #[cfg(feature = "verbs")]
        {
            let mut c = tensorferry_verbs::VerbsConfig::new("rxe0");
            c.writers = vec![tensorferry_zmq::CurvePublicKey([7; 32])];
            let e = open(DataPlane::Verbs(c));
            assert!(e.contains("writers is a node's"), "{e}");
        }
    }

    #[test]
    fn bad_names_and_options_are_named() {
        let none: [(&str, &str); 0] = [];
        let e = DataPlane::parse("carrier-pigeon", none).unwrap_err();
        assert!(e.to_string().contains("\"carrier-pigeon\""), "{e}");
        let e = DataPlane::parse("shm", [("provider", "tcp")]).unwrap_err();
        assert!(
            e.to_string().contains("takes no option \"provider\""),
            "{e}"
        );
        let e = DataPlane::parse("shm", [("threads", "many")]).unwrap_err();
        assert!(e.to_string().contains("option threads: \"many\""), "{e}");
        let plane = DataPlane::parse("shm", [("threads", "3"), ("split_at", "65536")]).unwrap();
        let DataPlane::Shm(copy) = plane else {
            panic!("not shm: {plane:?}");
        };
        assert_eq!((copy.threads, copy.split_at), (3, 65536));
        let plane = DataPlane::parse("local", [("threads", "2"), ("split_at", "4096")]).unwrap();
        let DataPlane::Local(local) = plane else {
            panic!("not local: {plane:?}");
        };
        assert_eq!((local.threads, local.split_at), (2, 4096));
        assert!(!DataPlane::default().needs_zmq());
        assert!(!DataPlane::default().reaches_other_hosts());
        assert!(!DataPlane::Local(LocalConfig::default()).needs_zmq());
    }
}
