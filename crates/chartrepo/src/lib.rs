//! The one chart-repository client of tender (decision 0117-one-chart-repository-client): the
//! hub's looks for `pollingInterval` and the agent's chart downloads both go through it.
//!
//! Every answer is bounded in size, redirects stay on the repository's origin (or go where the
//! caller allows), credentials are sent only to the origin they are for and never appear in a
//! message, and every failure carries a stable condition reason
//! ([`tender_types::conditions::reason`]).

mod http;
mod index;
mod oci;
mod tls;

#[cfg(test)]
mod tests;

pub use crate::http::{Budget, Http, Redirects, Reply, Side, redirect_allowed};
pub use crate::index::index_url;
pub use crate::oci::{Challenge, OciRef, Session, parse_challenge, parse_reference, unexpected};
pub use crate::tls::{Trust, system_roots};
pub use rustls::RootCertStore;
pub use tender_types::chart_version::ChartEntry;

use base64::Engine;

/// Why a look or download failed: a stable reason and a message with no credentials in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// A `tender_types::conditions::reason` word.
    pub reason: &'static str,
    /// What happened and what to do (URLs without user info, never a credential or a value).
    pub message: String,
}

impl Failure {
    /// A failure with `reason` and `message`.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// `scheme://host[:port]` of `url`.
pub fn origin(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host_len = rest.find('/').unwrap_or(rest.len());
    &url[..url.len() - rest.len() + host_len]
}

/// `url` without `user:password@`, for messages.
pub fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host_end = rest.find('/').unwrap_or(rest.len());
            let authority = &rest[..host_end];
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{}", &rest[host_end..])
        }
        None => url.to_string(),
    }
}

/// A chart URL from an index resolved against the repository URL.
pub fn absolute(repo: &str, url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!(
            "{}/{}",
            repo.trim_end_matches('/'),
            url.trim_start_matches('/')
        )
    }
}

/// `Basic base64(user:pass)`.
pub fn basic_auth(user: &str, pass: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    format!("Basic {token}")
}
