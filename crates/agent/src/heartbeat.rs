//! Heartbeat: renew the Lease `tender-agent` in the cluster namespace every
//! `heartbeat_interval` (default 30 s, one small write; a failed or stuck renewal is retried
//! within seconds), and write the Cluster's
//! `status.agent` at most every `cluster_status_interval` (default 5 min) or when what it says
//! changes. 10 000 agents thus cost ~333 Lease writes/s and ~33 Cluster status writes/s on the
//! hub at the defaults; Lease writes do not wake the hub's Cluster watches.

use std::sync::Arc;
use std::time::Duration;

// tokio's clock, so tests on its paused clock advance the Cluster status interval too.
use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use serde_json::json;
use tender_runtime::executor::{Apply, body_of};
use tender_runtime::{Executor, ObjectKey, Op};
use tender_types::conditions::reason;
use tender_types::names::AGENT_LEASE;
use tender_types::{AgentStatus, Cluster};

use crate::AgentMetrics;
use crate::cleanup::access_lost;
use crate::config::{AgentConfig, ShutdownSignal, VERSION};

/// The Lease body renewed on every heartbeat.
pub(crate) fn lease(config: &AgentConfig, now: Timestamp) -> Lease {
    let duration = (config.heartbeat_interval.as_secs() * 3).clamp(1, i32::MAX as u64) as i32;
    Lease {
        metadata: ObjectMeta {
            name: Some(AGENT_LEASE.into()),
            namespace: Some(config.cluster_namespace.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// What the Cluster's `status.agent` should say (apart from `lastSeen`).
pub(crate) fn agent_status(config: &AgentConfig, now: Timestamp) -> AgentStatus {
    AgentStatus {
        last_seen: Some(Time(now)),
        version: Some(VERSION.to_string()),
        namespace: Some(config.agent_namespace.clone()),
    }
}

/// Whether the Cluster status is due: never written, the interval passed, or its content
/// (version, namespace) differs from what the Cluster shows.
pub(crate) fn cluster_status_due(
    last_write: Option<Instant>,
    interval: Duration,
    shown: Option<&AgentStatus>,
    wanted: &AgentStatus,
) -> bool {
    let differs =
        shown.is_none_or(|s| s.version != wanted.version || s.namespace != wanted.namespace);
    differs || last_write.is_none_or(|t| t.elapsed() >= interval)
}

/// The Lease renewal: a plain apply on the hub (always written: renewing is the point).
fn lease_op(config: &AgentConfig, now: Timestamp) -> Op {
    Op::Apply(Apply {
        key: ObjectKey::of::<Lease>(Some(&config.cluster_namespace), AGENT_LEASE),
        body: body_of(&lease(config, now)),
        replace_if_immutable: false,
        fingerprint: None,
    })
}

/// The write of the Cluster's `status.agent`.
fn cluster_status_op(config: &AgentConfig, wanted: &AgentStatus) -> Op {
    Op::ApplyStatus(Apply {
        key: ObjectKey::of::<Cluster>(Some(&config.workspace_namespace), &config.cluster_name),
        body: json!({
            "apiVersion": tender_types::API_GROUP_VERSION,
            "kind": "Cluster",
            "metadata": { "name": config.cluster_name },
            "status": { "agent": wanted },
        }),
        replace_if_immutable: false,
        fingerprint: None,
    })
}

/// How long one heartbeat write may take: a third of the interval (10 s at the default),
/// so a write stuck on a slow or half-open connection is given up and retried while the
/// Lease (three intervals) still holds, instead of blocking the next renewals.
pub(crate) fn attempt_timeout(interval: Duration) -> Duration {
    (interval / 3).max(Duration::from_secs(1))
}

/// The wait before the next renewal: the interval after a success; after `failures` failed
/// renewals in a row, 2 s, 4 s, 8 s … capped at the interval, so one lost write does not
/// cost a whole interval of the Lease's three.
pub(crate) fn next_renewal(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    let backoff = Duration::from_secs(1u64 << failures.min(6));
    backoff.min(interval)
}

/// Heartbeats through the hub executor every `heartbeat_interval` until `shutdown`.
pub(crate) async fn run(
    hub: Arc<Executor>,
    config: AgentConfig,
    metrics: AgentMetrics,
    shutdown: ShutdownSignal,
) {
    let mut last_status: Option<Instant> = None;
    let mut shown: Option<AgentStatus> = None;
    let mut failures = 0u32;
    let bound = attempt_timeout(config.heartbeat_interval);
    let bounded = |op: Op| {
        let hub = hub.clone();
        async move {
            match tokio::time::timeout(bound, hub.execute(op)).await {
                Ok(result) => result.map(|_| ()).map_err(|e| (e.to_string(), e.reason())),
                Err(_) => Err((format!("no answer within {bound:?}"), "Timeout")),
            }
        }
    };
    loop {
        let now = Timestamp::now();
        let renewed = bounded(lease_op(&config, now)).await;
        let ok = renewed.is_ok();
        match renewed {
            Ok(()) => metrics.hub_access(false),
            // The hub refuses the identity: the Cluster was deleted or its access revoked.
            Err((error, why)) if access_lost(why) => {
                metrics.hub_access(true);
                tracing::error!(%error, reason = reason::HUB_ACCESS_LOST, cause = why, namespace = %config.cluster_namespace, "the hub refuses this agent's heartbeat (its Cluster was deleted, its access revoked or its token expired): nothing is deleted downstream; retrying");
            }
            Err((error, _)) => {
                tracing::warn!(%error, namespace = %config.cluster_namespace, "cannot renew the heartbeat Lease on the hub; retrying")
            }
        }
        metrics.heartbeat("lease", ok);
        failures = if ok { 0 } else { failures.saturating_add(1) };

        let wanted = agent_status(&config, now);
        if cluster_status_due(
            last_status,
            config.cluster_status_interval,
            shown.as_ref(),
            &wanted,
        ) {
            match bounded(cluster_status_op(&config, &wanted)).await {
                Ok(_) => {
                    last_status = Some(Instant::now());
                    shown = Some(wanted);
                    metrics.heartbeat("cluster_status", true);
                }
                Err((error, _)) => {
                    metrics.heartbeat("cluster_status", false);
                    tracing::warn!(%error, cluster = %config.cluster_name, "cannot write the Cluster's agent status on the hub; retrying");
                }
            }
        }

        tokio::select! {
            () = tokio::time::sleep(next_renewal(config.heartbeat_interval, failures)) => {}
            () = shutdown.clone() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_lasts_three_heartbeats() {
        let config = AgentConfig::new("ws", "c1");
        let l = lease(&config, Timestamp::from_second(10).unwrap());
        let spec = l.spec.unwrap();
        assert_eq!(spec.lease_duration_seconds, Some(90));
        assert_eq!(l.metadata.name.as_deref(), Some("tender-agent"));
        assert_eq!(
            l.metadata.namespace.as_deref(),
            Some(config.cluster_namespace.as_str())
        );
    }

    #[test]
    fn heartbeat_writes_are_a_lease_apply_and_a_status_apply() {
        let config = AgentConfig::new("ws", "c1");
        let now = Timestamp::from_second(10).unwrap();
        let Op::Apply(lease_write) = lease_op(&config, now) else {
            panic!("the Lease is applied");
        };
        assert_eq!(lease_write.body["kind"], "Lease");
        assert_eq!(lease_write.body["spec"]["holderIdentity"], "tender-agent");
        let Op::ApplyStatus(status) = cluster_status_op(&config, &agent_status(&config, now))
        else {
            panic!("the Cluster status is applied to the status subresource");
        };
        assert_eq!(status.key, ObjectKey::of::<Cluster>(Some("ws"), "c1"));
        assert_eq!(status.body["status"]["agent"]["version"], VERSION);
    }

    #[test]
    fn a_failed_renewal_is_retried_well_inside_the_lease() {
        let interval = Duration::from_secs(30);
        assert_eq!(next_renewal(interval, 0), interval);
        assert_eq!(next_renewal(interval, 1), Duration::from_secs(2));
        assert_eq!(next_renewal(interval, 2), Duration::from_secs(4));
        assert_eq!(next_renewal(interval, 4), Duration::from_secs(16));
        assert_eq!(
            next_renewal(interval, 5),
            interval,
            "capped at the interval"
        );
        assert_eq!(next_renewal(interval, u32::MAX), interval);
        // A stuck attempt is given up after a third of the interval: with the Lease lasting
        // three intervals, the renewal due one interval after the last success, stuck, and
        // three retries of it all start before the Lease expires.
        assert_eq!(attempt_timeout(interval), Duration::from_secs(10));
        assert_eq!(
            attempt_timeout(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        let worst = interval
            + attempt_timeout(interval)
            + (1..=3)
                .map(|f| next_renewal(interval, f) + attempt_timeout(interval))
                .sum::<Duration>();
        assert!(worst < interval * 3, "{worst:?}");
    }

    #[test]
    fn cluster_status_is_rate_limited() {
        let config = AgentConfig::new("ws", "c1");
        let wanted = agent_status(&config, Timestamp::from_second(10).unwrap());
        let min5 = Duration::from_secs(300);
        assert!(cluster_status_due(None, min5, None, &wanted), "first write");
        let just_now = Some(Instant::now());
        assert!(
            !cluster_status_due(just_now, min5, Some(&wanted), &wanted),
            "too soon"
        );
        let mut other = wanted.clone();
        other.version = Some("0.0.0".into());
        assert!(
            cluster_status_due(just_now, min5, Some(&other), &wanted),
            "content changed"
        );
        assert!(cluster_status_due(
            just_now,
            Duration::ZERO,
            Some(&wanted),
            &wanted
        ));
    }
}
