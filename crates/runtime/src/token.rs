//! A bearer token the process can replace while its client keeps running.
//!
//! An agent's hub credential is a bound ServiceAccount token that expires; the agent asks for
//! a new one before then and swaps it in here. Every request of the client built by
//! [`client_with_token`] reads the current value, so reflectors and watches keep going on the
//! new token without rebuilding the client (a watch already open keeps its connection, which
//! the apiserver authenticated once, and re-authenticates when it reconnects).

use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use base64::Engine as _;
use http::{HeaderValue, Request, header::AUTHORIZATION};
use kube::{Client, Config, client::ClientBuilder};
use tower::{Layer, Service};

use crate::{Error, Metrics, Result};

/// The current bearer token, shared by a client and whoever renews it. Never printed: its
/// `Debug` shows only the expiry.
#[derive(Clone)]
pub struct BearerToken(Arc<RwLock<String>>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerToken")
            .field("expires", &expiry(&self.get()))
            .finish_non_exhaustive()
    }
}

impl BearerToken {
    /// A token holding `token`.
    pub fn new(token: impl Into<String>) -> Self {
        Self(Arc::new(RwLock::new(token.into())))
    }

    /// The current token.
    pub fn get(&self) -> String {
        self.0.read().expect("token lock").clone()
    }

    /// Replaces the token; the next request uses it.
    pub fn set(&self, token: impl Into<String>) {
        *self.0.write().expect("token lock") = token.into();
    }
}

/// The `exp` claim (seconds since the epoch) of a JWT, read without verifying the signature:
/// only to decide when to renew, never to trust. `None` for a token that is not a JWT or has
/// no expiry (a legacy Secret-based token).
pub fn expiry(token: &str) -> Option<i64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_i64()
}

/// The bearer token of `config` (inline or from its token file), if it authenticates by one.
pub fn token_of(config: &Config) -> Option<String> {
    // kube's `AuthInfo` serialises its token in clear (for writing kubeconfigs); reading it
    // that way avoids depending on `secrecy` just to expose it.
    let auth = serde_json::to_value(&config.auth_info).ok()?;
    if let Some(t) = auth.get("token").and_then(|t| t.as_str()) {
        return Some(t.to_string());
    }
    let path = config.auth_info.token_file.as_ref()?;
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Like [`crate::client::client_from_config`], but authenticating every request with the
/// current value of `token` instead of the credentials in `config`.
pub fn client_with_token(
    mut config: Config,
    metrics: Option<Arc<Metrics>>,
    user_agent: &str,
    token: BearerToken,
) -> Result<Client> {
    config.auth_info.token = None;
    config.auth_info.token_file = None;
    let agent =
        HeaderValue::from_str(user_agent).map_err(|_| Error::UserAgent(user_agent.to_owned()))?;
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, agent));
    let builder = ClientBuilder::try_from(config)
        .map_err(Error::Client)?
        .with_layer(&SetBearerLayer { token });
    Ok(match metrics {
        Some(metrics) => builder
            .with_layer(&crate::client::CountRequestsLayer { metrics })
            .build(),
        None => builder.build(),
    })
}

#[derive(Clone)]
pub(crate) struct SetBearerLayer {
    token: BearerToken,
}

impl<S> Layer<S> for SetBearerLayer {
    type Service = SetBearer<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SetBearer {
            inner,
            token: self.token.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct SetBearer<S> {
    inner: S,
    token: BearerToken,
}

impl<S, B> Service<Request<B>> for SetBearer<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", self.token.get())) {
            value.set_sensitive(true);
            request.headers_mut().insert(AUTHORIZATION, value);
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", enc(r#"{"alg":"RS256"}"#), enc(claims))
    }

    #[test]
    fn expiry_reads_the_exp_claim_only_of_a_jwt() {
        assert_eq!(
            expiry(&jwt(r#"{"exp":1700000000,"sub":"x"}"#)),
            Some(1_700_000_000)
        );
        assert_eq!(expiry(&jwt(r#"{"sub":"x"}"#)), None);
        assert_eq!(expiry("not-a-jwt"), None);
        assert_eq!(expiry("a.!!!.c"), None);
    }

    #[test]
    fn debug_never_shows_the_token() {
        let t = BearerToken::new(jwt(r#"{"exp":5}"#));
        let shown = format!("{t:?}");
        assert!(shown.contains("Some(5)"), "{shown}");
        assert!(!shown.contains("sig"), "{shown}");
        t.set("other");
        assert_eq!(t.get(), "other");
    }
}
