//! Lease-based leader election: every replica keeps its caches warm, only the leader writes.
//!
//! This wraps `kube-lease-manager`'s manual `changed()` loop rather than its `watch()` helper,
//! because `watch()` keeps reporting "leader" while renewals fail (it only logs and backs off),
//! and the Lease may then expire and pass to another replica. Here any Lease API error steps
//! down immediately — the cautious answer, since we can no longer prove we hold the Lease —
//! and a fresh manager re-reads the Lease, which reports leadership again at once if the Lease
//! still names us.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};

/// Seconds a Lease stays valid after its last renewal; the longest a crashed leader blocks.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry that the holder renews, so renewals happen about every 5 s and a few
/// failed attempts or modest clock skew between nodes do not lose the Lease.
pub const LEASE_RENEW_BEFORE_EXPIRY_SECONDS: u64 = 10;

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
        let target = Target {
            client,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
        };
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
}

impl Target {
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

async fn run(target: Target, tx: watch::Sender<bool>, mut stop: oneshot::Receiver<()>) {
    let lease = format!("{}/{}", target.namespace, target.name);
    let mut retry = RETRY_MIN;
    loop {
        let built = tokio::select! {
            _ = &mut stop => return,
            built = target.manager() => built,
        };
        match built {
            Ok(manager) => loop {
                tokio::select! {
                    _ = &mut stop => {
                        tx.send_replace(false);
                        match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
                            Ok(Ok(())) => tracing::info!(%lease, "released leader lease"),
                            Ok(Err(error)) => tracing::warn!(%lease, %error, "cannot release leader lease; it will expire"),
                            Err(_) => tracing::warn!(%lease, "timed out releasing leader lease; it will expire"),
                        }
                        return;
                    }
                    changed = manager.changed() => match changed {
                        Ok(leader) => {
                            retry = RETRY_MIN;
                            tracing::info!(%lease, identity = %target.identity, leader, "leadership changed");
                            tx.send_replace(leader);
                        }
                        Err(error) => {
                            if tx.send_replace(false) {
                                tracing::warn!(%lease, %error, "stepping down: cannot confirm the leader lease");
                            } else {
                                tracing::warn!(%lease, %error, "leader lease error");
                            }
                            break;
                        }
                    },
                }
            },
            Err(error) => tracing::warn!(%lease, %error, "cannot read or create leader lease"),
        }
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(RETRY_MAX);
    }
}
