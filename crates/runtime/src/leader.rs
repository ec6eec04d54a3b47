//! Lease-based leader election: every replica keeps its caches warm, only the leader writes.
//!
//! This wraps `kube-lease-manager`'s manual `changed()` loop rather than its `watch()` helper,
//! because `watch()` keeps reporting "leader" while renewals fail (it only logs and backs off),
//! and the Lease may then expire and pass to another replica. Here any Lease API error steps
//! down immediately — the cautious answer, since we can no longer prove we hold the Lease —
//! and a fresh manager re-reads the Lease, which reports leadership again once a renewal of
//! ours succeeds.
//!
//! A renewal that neither succeeds nor fails (the request hangs: a proxy or network holding
//! it, while other requests flow) is no error at all for the manager, whose `changed()` then
//! waits as long as the client does. So the election watches the Lease writes itself (a layer
//! on its own client records when each successful one was sent) and steps down once
//! [`RENEW_DEADLINE`] has passed since the last, before the Lease can expire and a standby
//! take it (decision 0082-leader-steps-down-at-its-renew-deadline).
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Client;
use kube::client::Body;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
    time::Instant,
};

/// Seconds a Lease stays valid after its last renewal; the longest a crashed leader blocks.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry that the holder renews, so renewals happen about every 5 s and a few
/// failed attempts or modest clock skew between nodes do not lose the Lease.
pub const LEASE_RENEW_BEFORE_EXPIRY_SECONDS: u64 = 10;
/// How long after sending its last successful Lease write a leader still leads. Renewals start
/// 5 s after the last one, so this leaves them 5 s; it ends 5 s before the Lease it wrote
/// expires, which is when a standby may take it (the margin covers the request's transit).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// How long a step-down waits for the Lease release request before giving up.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a Lease API error before building a fresh manager.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// A running election for one Lease; exposes "am I leader" as a watch channel.
///
/// Dropping it (or calling [`LeaderElection::release`]) steps down and frees the Lease, so a
/// standby replica takes over without waiting for expiry.
#[derive(Debug)]
pub struct LeaderElection {
    is_leader: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl LeaderElection {
    /// Starts competing for Lease `namespace/name` as `identity` (use the pod name).
    ///
    /// The Lease is created if missing, so the service account needs get, create and patch on
    /// `coordination.k8s.io` leases in `namespace`. Must be called inside a Tokio runtime.
    pub fn start(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        let (tx, is_leader) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let target = Target::new(client, namespace, name, identity);
        let task = tokio::spawn(run(target, tx, stop_rx));
        Self {
            is_leader,
            stop: Some(stop_tx),
            task,
        }
    }

    /// A receiver that holds `true` while this replica leads; clone freely into controllers.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// Whether this replica leads right now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// Steps down: publishes `false`, releases the Lease (bounded wait) and stops competing.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Err(error) = (&mut self.task).await {
            tracing::warn!(%error, "leader election task ended abnormally");
        }
    }
}

impl Drop for LeaderElection {
    fn drop(&mut self) {
        // Dropping the sender wakes the task, which releases the Lease in the background.
        self.stop.take();
    }
}

struct Target {
    client: Client,
    namespace: String,
    name: String,
    identity: String,
    /// When the last successful write of the Lease was sent (see [`ObserveRenewals`]).
    renewals: Arc<watch::Sender<Option<Instant>>>,
}

impl Target {
    fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        let renewals = Arc::new(watch::channel(None).0);
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}");
        let default_ns = client.default_namespace().to_owned();
        let observed = ObserveRenewals {
            client,
            path,
            renewals: renewals.clone(),
        };
        Self {
            client: Client::new(observed, default_ns),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            renewals,
        }
    }

    async fn manager(&self) -> kube_lease_manager::Result<LeaseManager> {
        let params = LeaseParams::new(
            self.identity.clone(),
            LEASE_DURATION_SECONDS,
            LEASE_RENEW_BEFORE_EXPIRY_SECONDS,
        );
        LeaseManager::new(
            self.client.clone(),
            self.name.clone(),
            self.namespace.clone(),
            params,
            LeaseCreateMode::AutoCreate,
        )
        .await
    }
}

/// The election's client: every request goes through `client`; a successful write of the
/// Lease itself (acquire, renew) records when it was sent.
#[derive(Clone)]
struct ObserveRenewals {
    client: Client,
    path: String,
    renewals: Arc<watch::Sender<Option<Instant>>>,
}

impl tower::Service<http::Request<Body>> for ObserveRenewals {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let renews = is_lease_write(request.method(), request.uri().path(), &self.path);
        let client = self.client.clone();
        let renewals = self.renewals.clone();
        Box::pin(async move {
            let sent = Instant::now();
            let response = client.send(request).await?;
            if renews && response.status().is_success() {
                renewals.send_replace(Some(sent));
            }
            Ok(response)
        })
    }
}

/// Whether a request writes the Lease at `lease_path` (the manager's acquire and renew patches).
fn is_lease_write(method: &http::Method, path: &str, lease_path: &str) -> bool {
    use http::Method;
    path == lease_path && [Method::PATCH, Method::PUT].contains(method)
}

/// Whether this replica leads: the manager says it holds the Lease, and a write of the Lease
/// succeeded less than [`RENEW_DEADLINE`] ago (sent at `renewed`).
fn leads(holds: bool, renewed: Option<Instant>, now: Instant) -> bool {
    holds && renewed.is_some_and(|sent| now < sent + RENEW_DEADLINE)
}

async fn run(target: Target, tx: watch::Sender<bool>, mut stop: oneshot::Receiver<()>) {
    let lease = format!("{}/{}", target.namespace, target.name);
    let mut renewals = target.renewals.subscribe();
    let mut retry = RETRY_MIN;
    loop {
        let built = tokio::select! {
            _ = &mut stop => return,
            built = target.manager() => built,
        };
        match built {
            Ok(manager) => {
                let stopped = {
                    // Polled across the loop's turns (a renewal is never cancelled halfway),
                    // and dropped before a release, which needs the manager's state lock.
                    let mut changed = std::pin::pin!(manager.changed());
                    // What the manager last said: whether it holds the Lease.
                    let mut holds = false;
                    loop {
                        let leading = *tx.borrow();
                        let deadline = renewals.borrow().map(|sent| sent + RENEW_DEADLINE);
                        let step_down_at = deadline.filter(|_| leading);
                        tokio::select! {
                            _ = &mut stop => break true,
                            result = &mut changed => match result {
                                Ok(leader) => {
                                    retry = RETRY_MIN;
                                    holds = leader;
                                    changed.set(manager.changed());
                                }
                                Err(error) => {
                                    if tx.send_replace(false) {
                                        tracing::warn!(%lease, %error, "stepping down: cannot confirm the leader lease");
                                    } else {
                                        tracing::warn!(%lease, %error, "leader lease error");
                                    }
                                    break false;
                                }
                            },
                            _ = renewals.changed() => {}
                            () = sleep_until(step_down_at), if step_down_at.is_some() => {
                                tx.send_replace(false);
                                tracing::warn!(
                                    %lease,
                                    deadline_seconds = RENEW_DEADLINE.as_secs(),
                                    "stepping down: no lease renewal succeeded within the renew deadline"
                                );
                                // A fresh manager; the pending renewal goes with this one.
                                break false;
                            }
                        }
                        let now = leads(holds, *renewals.borrow(), Instant::now());
                        if now != *tx.borrow() {
                            tracing::info!(%lease, identity = %target.identity, leader = now, "leadership changed");
                            tx.send_replace(now);
                        }
                    }
                };
                if stopped {
                    tx.send_replace(false);
                    match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
                        Ok(Ok(())) => tracing::info!(%lease, "released leader lease"),
                        Ok(Err(error)) => {
                            tracing::warn!(%lease, %error, "cannot release leader lease; it will expire")
                        }
                        Err(_) => {
                            tracing::warn!(%lease, "timed out releasing leader lease; it will expire")
                        }
                    }
                    return;
                }
            }
            Err(error) => tracing::warn!(%lease, %error, "cannot read or create leader lease"),
        }
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(RETRY_MAX);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/tender-system/leases/tender-hub";

    #[test]
    fn only_writes_of_the_lease_itself_are_renewals() {
        assert!(is_lease_write(&http::Method::PATCH, PATH, PATH));
        assert!(is_lease_write(&http::Method::PUT, PATH, PATH));
        assert!(!is_lease_write(&http::Method::GET, PATH, PATH));
        assert!(!is_lease_write(
            &http::Method::PATCH,
            "/apis/coordination.k8s.io/v1/namespaces/tender-system/leases/tender-hub-a",
            PATH
        ));
        assert!(!is_lease_write(
            &http::Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/tender-system/leases",
            PATH
        ));
    }

    #[test]
    fn a_holder_leads_only_within_the_renew_deadline_of_its_last_renewal() {
        let sent = Instant::now();
        assert!(leads(true, Some(sent), sent));
        assert!(leads(
            true,
            Some(sent),
            sent + RENEW_DEADLINE - Duration::from_millis(1)
        ));
        assert!(!leads(true, Some(sent), sent + RENEW_DEADLINE));
        // The manager's word alone (a fresh manager reading a Lease that still names us) is
        // not enough: a renewal of ours must have succeeded.
        assert!(!leads(true, None, sent));
        assert!(!leads(false, Some(sent), sent));
        // The deadline ends before the Lease it renewed expires.
        assert!(RENEW_DEADLINE < Duration::from_secs(LEASE_DURATION_SECONDS));
        assert!(
            RENEW_DEADLINE
                > Duration::from_secs(LEASE_DURATION_SECONDS - LEASE_RENEW_BEFORE_EXPIRY_SECONDS)
        );
    }
}
