//! What a control channel must be for an instance node to run on it.

use tensorferry_core::transport::{ControlChannel, ControlSend};

/// A [`ControlChannel`] an instance node can run on: both its sides move
/// to the node's progress thread for the node's life, and its send errors
/// may cross threads inside a [`NodeError`](super::NodeError). Every
/// control channel with such sides is one; the bounds are written once,
/// here, for every way of starting a node.
pub trait InstanceChannel:
    ControlChannel<Sender: ControlSend<Error: Send + Sync + 'static> + 'static, Receiver: 'static>
{
}

impl<C> InstanceChannel for C where
    C: ControlChannel<
        Sender: ControlSend<Error: Send + Sync + 'static> + 'static,
        Receiver: 'static,
    >
{
}
