//! The agent's hub credential: a bound ServiceAccount token that expires, renewed by the
//! agent itself before it does.
//!
//! Registration (`tender cluster add`) hands out a token of the agent's ServiceAccount with a
//! short expiry. The running agent asks the TokenRequest API for a new token of that same
//! ServiceAccount (its Role allows `create` on `serviceaccounts/token` for its own name only),
//! swaps it into its hub client ([`BearerToken`]) and, when told where, stores the renewed
//! kubeconfig in its downstream Secret so a restarted agent starts from a live token.
//! Deleting the Cluster deletes the ServiceAccount with the cluster namespace, and every
//! token of it stops authenticating at once.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use tender_runtime::token::{BearerToken, expiry};
use tender_types::names;

/// Default lifetime the agent asks for its hub token.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// Default: renew when less than this is left of the current token.
pub const DEFAULT_TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(1200);
/// The apiserver refuses a TokenRequest `expirationSeconds` below this.
pub const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(600);

/// How the agent renews its hub token.
#[derive(Clone, Debug)]
pub struct Renewal {
    /// Lifetime asked for each new token (at least [`MIN_TOKEN_LIFETIME`]).
    pub lifetime: Duration,
    /// Renew when less than this is left.
    pub margin: Duration,
}

impl Default for Renewal {
    fn default() -> Self {
        Self {
            lifetime: DEFAULT_TOKEN_LIFETIME,
            margin: DEFAULT_TOKEN_REFRESH_MARGIN,
        }
    }
}

/// Where the agent keeps its renewed hub kubeconfig downstream (Secret key `kubeconfig`).
#[derive(Clone)]
pub struct Persist {
    /// Client of the downstream cluster.
    pub downstream: Client,
    /// Namespace of the Secret (the agent's namespace).
    pub namespace: String,
    /// Name of the Secret (`tender-agent-hub` when installed by the CLI or the chart).
    pub name: String,
    /// The hub kubeconfig the agent started from; only its token changes.
    pub kubeconfig: Kubeconfig,
}

/// How long to wait before renewing a token expiring at `exp` (seconds since the epoch) at
/// `now`: until `margin` before expiry, at least one second so a margin as long as the
/// lifetime cannot spin; at once for a token without expiry (legacy) — it is exchanged for a
/// bound one. Pure.
pub fn renew_in(exp: Option<i64>, now: i64, margin: Duration) -> Duration {
    let Some(exp) = exp else {
        return Duration::ZERO;
    };
    let at = exp.saturating_sub(i64::try_from(margin.as_secs()).unwrap_or(i64::MAX));
    Duration::from_secs(u64::try_from(at.saturating_sub(now)).unwrap_or(0).max(1))
}

/// Of the token the agent was started with and the one it stored downstream, the one that
/// lives longer (a token without expiry counts as the shortest). Pure.
pub fn fresher(mounted: String, stored: Option<String>) -> String {
    match stored {
        Some(s) if expiry(&s).unwrap_or(i64::MIN) > expiry(&mounted).unwrap_or(i64::MIN) => s,
        _ => mounted,
    }
}

/// The token in a kubeconfig's first user, if any.
pub fn kubeconfig_token(kubeconfig: &Kubeconfig) -> Option<String> {
    let users = serde_json::to_value(&kubeconfig.auth_infos).ok()?;
    users
        .get(0)?
        .get("user")?
        .get("token")?
        .as_str()
        .map(ToString::to_string)
}

/// `kubeconfig` with every user's token replaced by `token`, as JSON (which is YAML).
pub fn with_token(kubeconfig: &Kubeconfig, token: &str) -> serde_json::Result<String> {
    let mut value = serde_json::to_value(kubeconfig)?;
    if let Some(users) = value.get_mut("users").and_then(|u| u.as_array_mut()) {
        for user in users {
            if let Some(u) = user.get_mut("user").and_then(|u| u.as_object_mut()) {
                u.remove("tokenFile");
                u.insert("token".into(), token.into());
            }
        }
    }
    serde_json::to_string(&value)
}

/// The token stored in the downstream Secret, if it exists and holds one.
pub async fn stored_token(persist: &Persist) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(persist.downstream.clone(), &persist.namespace);
    let secret = secrets.get_opt(&persist.name).await.ok()??;
    let text = secret.data?.get("kubeconfig")?.0.clone();
    let kubeconfig = Kubeconfig::from_yaml(std::str::from_utf8(&text).ok()?).ok()?;
    kubeconfig_token(&kubeconfig)
}

/// Asks the hub for a new token of the agent's own ServiceAccount in `cluster_namespace`.
pub async fn request_token(
    hub: &Client,
    cluster_namespace: &str,
    lifetime: Duration,
) -> kube::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), cluster_namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(
                i64::try_from(lifetime.max(MIN_TOKEN_LIFETIME).as_secs()).unwrap_or(i64::MAX),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(
            names::AGENT_SERVICE_ACCOUNT,
            &PostParams::default(),
            &request,
        )
        .await?;
    Ok(issued.status.and_then(|s| s.token).unwrap_or_default())
}

/// A merge patch of `data.kubeconfig` only, not the executor's server-side apply: the Secret
/// was created by the CLI's manifests or the chart, and taking ownership of its other fields
/// would fight them.
async fn store(persist: &Persist, token: &str) -> anyhow::Result<()> {
    let text = with_token(&persist.kubeconfig, token)?;
    let secrets: Api<Secret> = Api::namespaced(persist.downstream.clone(), &persist.namespace);
    let patch = serde_json::json!({"data": {"kubeconfig": ByteString(text.into_bytes())}});
    secrets
        .patch(
            &persist.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// Renews `token` before it expires, for as long as `shutdown` has not resolved: each renewal
/// is a TokenRequest made with the current token, swapped in at once and, with `persist`,
/// stored downstream. A failed request is retried every 10 s (up to the margin before
/// expiry, which is why the margin should be minutes).
pub async fn keep_fresh(
    hub: Client,
    token: BearerToken,
    cluster_namespace: String,
    renewal: Renewal,
    persist: Option<Persist>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let wait = renew_in(expiry(&token.get()), now, renewal.margin);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut shutdown => return,
        }
        match request_token(&hub, &cluster_namespace, renewal.lifetime).await {
            Ok(new) if !new.is_empty() => {
                token.set(new.clone());
                tracing::info!(expires = ?expiry(&new), "hub token renewed");
                if let Some(p) = &persist
                    && let Err(error) = store(p, &new).await
                {
                    tracing::warn!(%error, secret = %p.name, namespace = %p.namespace, "storing the renewed hub kubeconfig downstream failed; a restart would use the older token");
                }
            }
            Ok(_) => tracing::warn!("the hub answered a TokenRequest without a token"),
            Err(error) => {
                tracing::warn!(%error, "renewing the hub token failed; retrying in 10s");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                    () = &mut shutdown => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unsigned JWTs with `{"exp":100}`, `{"exp":200}` and `{}` as claims.
    fn jwt(exp: Option<i64>) -> String {
        let claims = match exp {
            Some(100) => "eyJleHAiOjEwMH0",
            Some(200) => "eyJleHAiOjIwMH0",
            _ => "e30",
        };
        format!("e30.{claims}.sig")
    }

    #[test]
    fn renews_margin_before_expiry_and_never_spins() {
        let m = Duration::from_secs(1200);
        assert_eq!(renew_in(Some(10_000), 5_000, m), Duration::from_secs(3_800));
        // Inside the margin or already expired: as soon as possible, but not a busy loop.
        assert_eq!(renew_in(Some(10_000), 9_500, m), Duration::from_secs(1));
        assert_eq!(renew_in(Some(10_000), 20_000, m), Duration::from_secs(1));
        // A legacy token without expiry is exchanged at once.
        assert_eq!(renew_in(None, 5_000, m), Duration::ZERO);
        // A 600 s token with a 595 s margin (the e2e test) renews every 5 s.
        assert_eq!(
            renew_in(Some(1_600), 1_000, Duration::from_secs(595)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn the_longer_lived_token_wins_at_start_up() {
        let (short, long) = (jwt(Some(100)), jwt(Some(200)));
        assert_eq!(fresher(short.clone(), Some(long.clone())), long);
        assert_eq!(fresher(long.clone(), Some(short.clone())), long);
        assert_eq!(fresher(short.clone(), None), short);
        assert_eq!(fresher(jwt(None), Some(short.clone())), short);
    }

    #[test]
    fn a_renewed_kubeconfig_keeps_everything_but_the_token() {
        let text = tender_runtime::kubeconfig::TokenKubeconfig {
            name: "hub",
            server: "https://hub:6443",
            ca_pem: b"CA",
            user: "tender-agent",
            token: "old",
            namespace: Some("cluster-ns"),
        }
        .to_yaml();
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kubeconfig_token(&kc).as_deref(), Some("old"));
        let renewed = Kubeconfig::from_yaml(&with_token(&kc, "new").unwrap()).unwrap();
        assert_eq!(kubeconfig_token(&renewed).as_deref(), Some("new"));
        let json = |v: &Kubeconfig| {
            let mut v = serde_json::to_value(v).unwrap();
            v["users"] = serde_json::Value::Null;
            v
        };
        assert_eq!(json(&renewed), json(&kc));
        assert_eq!(renewed.current_context, kc.current_context);
    }
}
