//! [`Guard`]: who may connect to the sockets a process binds (an
//! allow-list of addresses, CURVE keys), set up the same way on every
//! ZeroMQ socket ferry binds or connects: the control channel's, and the
//! verbs data plane's side channel.

use std::net::IpAddr;

use crate::curve::{CurveConfig, CurvePublicKey};
use crate::error::{sys, ZmqError};
use crate::zap::{self, Policy, ZapHandler};
use crate::zmq;

/// Who may connect to the sockets a process binds, and how its own
/// sockets connect. The default guards nothing (plain ZeroMQ).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    /// Addresses that may connect to `tcp://` sockets (`--allow-from`);
    /// empty: any.
    pub allow: Vec<IpAddr>,
    /// CurveZMQ (`--curve-key`, `--curve-peers`): every bound socket a
    /// CURVE server admitting only the listed keys, every connection a
    /// CURVE client; `None`: plain ZeroMQ.
    pub curve: Option<CurveConfig>,
}

impl Guard {
    /// A guard with only an allow-list.
    pub fn allowing(allow: &[IpAddr]) -> Self {
        Self {
            allow: allow.to_vec(),
            curve: None,
        }
    }

    /// True if it enforces anything (a handler must answer for `ctx`).
    pub fn enforces(&self) -> bool {
        !self.allow.is_empty() || self.curve.is_some()
    }

    /// Starts the authentication handler of `ctx` if this guard enforces
    /// anything (one per context; keep it as long as the sockets it
    /// guards). Without it libzmq would let any CURVE key in.
    /// With CURVE, a libzmq without it is [`ZmqError::NoCurve`] here, before
    /// any socket would fail its handshakes one by one.
    pub fn start(&self, ctx: &zmq::Context) -> Result<Option<ZapHandler>, ZmqError> {
        if !self.enforces() {
            return Ok(None);
        }
        if self.curve.is_some() {
            curve_available(zmq::has("curve"))?;
        }
        let policy = Policy {
            allow: self.allow.clone(),
            keys: self.curve.as_ref().map(|c| c.peers.clone()),
        };
        ZapHandler::start(ctx, policy).map(Some)
    }

    /// The ZAP domain a socket bound on `endpoint` is given (see
    /// [`server`](Self::server)), for a handler of another ZeroMQ binding
    /// (pyzmq's) that asks [`admits`](Self::admits); `None`: the socket is
    /// not put to the handler.
    pub fn domain(&self, endpoint: &str) -> Option<&'static str> {
        let tcp = endpoint.starts_with("tcp://");
        match (tcp, self.curve.is_some()) {
            (true, _) if self.enforces() => Some(zap::DOMAIN),
            (false, true) => Some(zap::LOCAL_DOMAIN),
            _ => None,
        }
    }

    /// The verdict on a connection, as ZeroMQ's authentication protocol
    /// puts it to a handler: to a socket of `domain` (as
    /// [`domain`](Self::domain) named it), from `address`, with
    /// `mechanism` (`NULL`, `CURVE`) and its `credentials` (CURVE: the
    /// client's public key). `Ok`: admitted, with the User-Id its messages
    /// carry (the key in Z85, empty without CURVE); `Err`: why not. What
    /// ferry's own handler answers, for handlers of other bindings.
    pub fn admits(
        &self,
        domain: &str,
        address: &str,
        mechanism: &[u8],
        credentials: &[u8],
    ) -> Result<String, &'static str> {
        let policy = Policy {
            allow: self.allow.clone(),
            keys: self.curve.as_ref().map(|c| c.peers.clone()),
        };
        let v = zap::verdict(&policy, domain.as_bytes(), address, mechanism, credentials);
        if v.code == "200" {
            Ok(v.user)
        } else {
            Err(v.text)
        }
    }

    /// Sets up `s`, about to bind `endpoint`: a CURVE server with this
    /// process's key, and the domain that puts its connections to the
    /// handler (on `tcp://` whenever anything is enforced; elsewhere with
    /// CURVE, which has keys to check).
    pub fn server(&self, s: &zmq::Socket, endpoint: &str) -> Result<(), ZmqError> {
        if let Some(c) = &self.curve {
            s.set_curve_server(true)
                .map_err(sys("setsockopt(CURVE_SERVER)", endpoint))?;
            s.set_curve_secretkey(c.key.secret())
                .map_err(sys("setsockopt(CURVE_SECRETKEY)", endpoint))?;
        }
        let Some(domain) = self.domain(endpoint) else {
            return Ok(());
        };
        s.set_zap_domain(domain)
            .map_err(sys("setsockopt(ZAP_DOMAIN)", endpoint))
    }

    /// Sets up `s`, about to connect to `endpoint`, whose server key is
    /// `server`: a CURVE client with this process's key pair. With no
    /// server key the connection is plain, and with no key of its own
    /// this process cannot reach a CURVE server (an error).
    pub fn client(
        &self,
        s: &zmq::Socket,
        endpoint: &str,
        server: Option<&CurvePublicKey>,
    ) -> Result<(), ZmqError> {
        let Some(server) = server else {
            return Ok(());
        };
        let Some(c) = &self.curve else {
            return Err(ZmqError::NoKey {
                endpoint: endpoint.to_owned(),
            });
        };
        s.set_curve_serverkey(&server.0)
            .map_err(sys("setsockopt(CURVE_SERVERKEY)", endpoint))?;
        s.set_curve_publickey(&c.key.public().0)
            .map_err(sys("setsockopt(CURVE_PUBLICKEY)", endpoint))?;
        s.set_curve_secretkey(c.key.secret())
            .map_err(sys("setsockopt(CURVE_SECRETKEY)", endpoint))
    }
}

/// Whether libzmq can serve CURVE, given what `zmq_has("curve")` says.
fn curve_available(has: Option<bool>) -> Result<(), ZmqError> {
    match has {
        Some(true) => Ok(()),
        _ => Err(ZmqError::NoCurve),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libzmq_without_curve_is_named_with_the_fix() {
        assert!(curve_available(Some(true)).is_ok());
        let e = curve_available(Some(false)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("built without CURVE"), "{text}");
        assert!(text.contains("tensorferry-zmq-sys"), "{text}");
        assert!(text.contains("without CURVE keys"), "{text}");
        assert!(matches!(curve_available(None), Err(ZmqError::NoCurve)));
        // This build's libzmq has it, so a guard with keys starts.
        let key = crate::CurveKeyPair::generate().unwrap();
        let guard = Guard {
            allow: Vec::new(),
            curve: Some(CurveConfig {
                peers: vec![*key.public()],
                key,
            }),
        };
        assert!(guard.start(&zmq::Context::new()).unwrap().is_some());
    }
}
