//! A data plane for tests: another plane whose every write completion is
//! held back by a fixed delay (the fault injector's delayed writes,
//! [`crate::fault::FaultyTransport`]), to see what a slower fabric does
//! to the hand-off without one. Nodes only.

use std::time::Duration;

use tensorferry_zmq::Guard;

use super::options::{Options, PlaneError};
use super::{AnyTransport, AnyTransportError, DataPlane, Spec};
use crate::engine::EngineError;
use crate::fault::{FaultError, FaultPlan, FaultyTransport};
use crate::runtime::NodeError;

/// What the `delay` plane wraps, and by how much.
#[derive(Clone, Debug)]
pub struct DelayConfig {
    /// The plane whose completions are delayed (its default options).
    pub over: Box<DataPlane>,
    /// How long each write's completion is held back.
    pub delay: Duration,
}

/// The delay plane's spec.
pub(super) struct Delay;

impl Spec for Delay {
    const NAME: &'static str = "delay";
    const OPTIONS: &'static [&'static str] = &["over", "delay"];
    type Config = DelayConfig;
    type Node = FaultyTransport<AnyTransport>;
    type NodeError = FaultError<AnyTransportError>;
    type Engine = FaultyTransport<AnyTransport>;

    /// Reads `over` (a plane's name, default `shm`) and `delay` (default
    /// 1 ms).
    fn parse(mut o: Options) -> Result<DelayConfig, PlaneError> {
        let name = o.text("over").unwrap_or_else(|| "shm".to_owned());
        let none: [(&str, &str); 0] = [];
        let over =
            DataPlane::parse(&name, none).map_err(|e| o.bad("over", &name, e.to_string()))?;
        let delay = o.duration("delay")?.unwrap_or(Duration::from_millis(1));
        o.finish()?;
        Ok(DelayConfig {
            over: Box::new(over),
            delay,
        })
    }

    fn open_node(
        config: &DelayConfig,
        pool_len: usize,
    ) -> Result<FaultyTransport<AnyTransport>, NodeError> {
        let plan = FaultPlan {
            delay_write: 1.0,
            delay: config.delay,
            ..FaultPlan::default()
        };
        Ok(FaultyTransport::new(config.over.open(pool_len)?, plan))
    }

    fn open_engine(
        _: DelayConfig,
        _: &Guard,
    ) -> Result<FaultyTransport<AnyTransport>, EngineError> {
        Err(EngineError::Unsuitable {
            plane: Self::NAME.into(),
            why: "it is a test plane for nodes".into(),
        })
    }

    fn guard(config: &mut DelayConfig, guard: &Guard) {
        config.over.guard(guard);
    }

    fn reaches_other_hosts(config: &DelayConfig) -> bool {
        config.over.reaches_other_hosts()
    }

    fn needs_zmq(config: &DelayConfig) -> bool {
        config.over.needs_zmq()
    }
}
