//! A Cluster's status as the hub writes it: heartbeat, connectivity, summary (pure).

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tender_types::conditions::{
    self, TYPE_AGENT_CONNECTED, TYPE_CLUSTER_CONNECTED, TYPE_READY, reason,
};
use tender_types::{BundleSummary, Cluster, ClusterDisplay, ClusterMode, ClusterStatus, hash};

use crate::push::PushState;
use crate::summary::summary_reason;

/// When the agent last reported: the later of its Lease renewal and `status.agent.lastSeen`.
pub fn last_heartbeat(cluster: &Cluster, lease_renewed: Option<Timestamp>) -> Option<Timestamp> {
    let seen = cluster
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.last_seen.as_ref())
        .map(|t| t.0);
    seen.into_iter().chain(lease_renewed).max()
}

/// The Cluster status the hub writes (everything but `agent`, which is the agent's), starting
/// from `existing` so an unchanged result compares equal; and when to look again because the
/// heartbeat will expire. `push` is the hub's connection to a push cluster (`None`: pull mode):
/// it sets `ClusterConnected`, and a push cluster the hub cannot reach is not Ready for that
/// reason, whatever the heartbeat of its in-hub agent says.
#[allow(clippy::too_many_arguments)]
pub fn cluster_status(
    existing: Option<&ClusterStatus>,
    namespace: &str,
    heartbeat: Option<Timestamp>,
    summary: BundleSummary,
    paused: bool,
    push: Option<&PushState>,
    generation: Option<i64>,
    now: Timestamp,
    offline_after: Duration,
) -> (ClusterStatus, Option<Duration>) {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    status.namespace = Some(namespace.to_string());
    status.mode = Some(if push.is_some() {
        ClusterMode::Push
    } else {
        ClusterMode::Pull
    });
    let offline_ms = i64::try_from(offline_after.as_millis()).unwrap_or(i64::MAX);
    let (connected, agent_reason, agent_message, recheck) = match heartbeat {
        None if push.is_some() => (
            false,
            reason::WAITING_FOR_AGENT,
            "the hub's agent for this push cluster has not reported in yet".to_string(),
            None,
        ),
        None => (
            false,
            reason::WAITING_FOR_AGENT,
            "no heartbeat from the agent yet; install it with the kubeconfig built from the tender-agent-token Secret".to_string(),
            None,
        ),
        Some(last) => {
            let age_ms = now.as_millisecond() - last.as_millisecond();
            if age_ms < offline_ms {
                let left = u64::try_from(offline_ms - age_ms).unwrap_or(0);
                (
                    true,
                    reason::AGENT_CONNECTED,
                    "the agent reports in".to_string(),
                    Some(Duration::from_millis(left) + Duration::from_secs(1)),
                )
            } else {
                (
                    false,
                    reason::AGENT_OFFLINE,
                    format!("no heartbeat from the agent since {last}"),
                    None,
                )
            }
        }
    };
    let now = Time(now);
    match push {
        Some(state) => {
            conditions::set_condition(
                &mut status.conditions,
                TYPE_CLUSTER_CONNECTED,
                state.is_connected(),
                state.reason(),
                &state.message(),
                generation,
                now.clone(),
            );
        }
        None => status
            .conditions
            .retain(|c| c.type_ != TYPE_CLUSTER_CONNECTED),
    }
    conditions::set_condition(
        &mut status.conditions,
        TYPE_AGENT_CONNECTED,
        connected,
        agent_reason,
        &agent_message,
        generation,
        now.clone(),
    );
    let ready_bundles = format!("{}/{}", summary.ready, summary.desired_ready);
    let unreachable = push.filter(|p| !p.is_connected());
    let (ready, ready_reason, message, state) = if let Some(p) = unreachable {
        (false, p.reason(), p.message(), p.reason())
    } else if !connected {
        let state = if heartbeat.is_none() {
            "WaitingForAgent"
        } else {
            "Offline"
        };
        (false, agent_reason, agent_message.clone(), state)
    } else if paused {
        (
            false,
            reason::PAUSED,
            "the cluster is paused".to_string(),
            "Paused",
        )
    } else if let Some((why, _)) = summary_reason(&summary) {
        (
            false,
            why,
            format!("{ready_bundles} BundleDeployments ready"),
            "NotReady",
        )
    } else {
        (true, reason::READY, String::new(), "Ready")
    };
    conditions::set_condition(
        &mut status.conditions,
        TYPE_READY,
        ready,
        ready_reason,
        &message,
        generation,
        now,
    );
    status.summary = Some(summary);
    status.display = Some(ClusterDisplay {
        ready_bundles,
        state: state.to_string(),
    });
    (status, recheck)
}

/// The status of a Cluster whose namespace is not the hub's own
/// (decision 0074-cluster-namespaces-provably-the-hubs): no namespace named, not Ready with reason
/// `NamespaceNotOwned`; the agent's field kept. Pure.
pub fn not_owned_status(
    existing: Option<&ClusterStatus>,
    namespace: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> ClusterStatus {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    status.namespace = None;
    conditions::set_condition(
        &mut status.conditions,
        TYPE_READY,
        false,
        reason::NAMESPACE_NOT_OWNED,
        &tender_types::ownership::not_owned_message(namespace),
        generation,
        Time(now),
    );
    status.display = Some(ClusterDisplay {
        ready_bundles: "0/0".to_string(),
        state: reason::NAMESPACE_NOT_OWNED.to_string(),
    });
    status
}

/// Key of a status in the executor's write memo: its content without condition transition times.
/// A reconcile that runs before the cache has our last status write sees no conditions and
/// stamps new ones with the current time; that is the status already written, not a new one
/// (without this, most provisioned Clusters got their first status written twice).
pub(super) fn status_key(status: &ClusterStatus) -> String {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(conditions) = value.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for c in conditions.iter_mut().filter_map(|c| c.as_object_mut()) {
            c.remove("lastTransitionTime");
        }
    }
    hash::value_hash(&value)
}

/// Whether going from the written summary `old` to `new` only moves ready BundleDeployments
/// to `WaitApplied`: the hub wrote them a new version (a rotation, an edited Bundle) that their
/// agents have not reported on yet. Nothing failed, none came or went. Pure.
pub(super) fn rollout_only(old: &BundleSummary, new: &BundleSummary) -> bool {
    new.desired_ready == old.desired_ready
        && new.wait_applied > old.wait_applied
        && new.ready < old.ready
        && new.err_applied <= old.err_applied
        && new.modified <= old.modified
        && new.not_ready <= old.not_ready
        && new.pending <= old.pending
}

/// How long a pending summary-only change still waits, given when each pending one is due
/// (`due`, by cluster): `delay` is `Some` for a summary-only change. The first sight of one
/// starts its clock, and a later change with a shorter delay brings it forward (a rollout
/// that turns into a failure waits no longer than the failure would); once due, or when the
/// change is of another kind (or gone), the entry is cleared and `None` means write now (or
/// nothing to wait for). Pure.
pub(super) fn summary_wait<K: std::hash::Hash + Eq + Clone>(
    due: &mut std::collections::HashMap<K, Instant>,
    key: K,
    delay: Option<Duration>,
    now: Instant,
) -> Option<Duration> {
    let Some(delay) = delay.filter(|d| !d.is_zero()) else {
        due.remove(&key);
        return None;
    };
    let at = *due
        .entry(key.clone())
        .and_modify(|at| *at = (*at).min(now + delay))
        .or_insert(now + delay);
    if at <= now {
        due.remove(&key);
        return None;
    }
    Some(at - now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    fn summary(desired: i32, ready: i32) -> BundleSummary {
        BundleSummary {
            desired_ready: desired,
            ready,
            wait_applied: desired - ready,
            ..Default::default()
        }
    }

    #[test]
    fn a_summary_only_change_waits_once_then_is_written() {
        let mut due = std::collections::HashMap::new();
        let t0 = Instant::now();
        let delay = Some(Duration::from_secs(5));
        assert_eq!(
            summary_wait(&mut due, "c", delay, t0),
            Some(Duration::from_secs(5))
        );
        // Later reconciles keep the first clock: they do not push the write further away.
        assert_eq!(
            summary_wait(&mut due, "c", delay, t0 + Duration::from_secs(3)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            summary_wait(&mut due, "c", delay, t0 + Duration::from_secs(5)),
            None
        );
        assert!(due.is_empty(), "written: the clock is cleared");
        // The summary went back (or another change is written at once): the clock is cleared.
        summary_wait(&mut due, "c", delay, t0);
        assert_eq!(
            summary_wait(&mut due, "c", None, t0 + Duration::from_secs(1)),
            None
        );
        assert!(due.is_empty());
        // A zero delay writes at once.
        assert_eq!(summary_wait(&mut due, "c", Some(Duration::ZERO), t0), None);
        assert!(due.is_empty());
    }

    #[test]
    fn a_rollout_waits_longer_until_it_turns_into_something_else() {
        let mut due = std::collections::HashMap::new();
        let t0 = Instant::now();
        let (rollout, failure) = (Some(Duration::from_secs(30)), Some(Duration::from_secs(5)));
        assert_eq!(
            summary_wait(&mut due, "c", rollout, t0),
            Some(Duration::from_secs(30))
        );
        // 10 s in, one BundleDeployment fails to apply: written 5 s later, not 20.
        assert_eq!(
            summary_wait(&mut due, "c", failure, t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(5))
        );
        // Back to rolling out: the earlier clock stays.
        assert_eq!(
            summary_wait(&mut due, "c", rollout, t0 + Duration::from_secs(12)),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn only_ready_deployments_moving_to_wait_applied_are_a_rollout() {
        let ready = summary(3, 3);
        let mut rolling = summary(3, 1);
        assert_eq!(rolling.wait_applied, 2);
        assert!(rollout_only(&ready, &rolling));
        // Partly rolled out, further along or not: still measured against what was written.
        rolling.ready = 2;
        rolling.wait_applied = 1;
        assert!(rollout_only(&ready, &rolling));
        // Nothing moved, or moved back: not a rollout (and not a change at all).
        assert!(!rollout_only(&ready, &ready));
        // A deployment added (first deployment of a new Bundle): counted as usual.
        let mut added = summary(4, 3);
        added.pending = 1;
        added.wait_applied = 0;
        assert!(!rollout_only(&ready, &added));
        // A failure, drift or an unready object is never held back as a rollout.
        for field in 0..3 {
            let mut worse = summary(3, 1);
            worse.wait_applied = 1;
            match field {
                0 => worse.err_applied = 1,
                1 => worse.modified = 1,
                _ => worse.not_ready = 1,
            }
            assert!(!rollout_only(&ready, &worse), "{worse:?}");
        }
        // A cluster already waiting on its agent: more of it waiting is still the rollout.
        let waiting = summary(3, 2);
        assert!(rollout_only(&waiting, &summary(3, 0)));
    }

    #[test]
    fn heartbeat_drives_connected_offline_and_recheck() {
        let after = Duration::from_secs(90);
        let (waiting, recheck) = cluster_status(
            None,
            "ns",
            None,
            summary(0, 0),
            false,
            None,
            Some(1),
            at(100),
            after,
        );
        assert_eq!(waiting.display.as_ref().unwrap().state, "WaitingForAgent");
        assert!(recheck.is_none(), "nothing to wait for without an agent");
        assert_eq!(waiting.namespace.as_deref(), Some("ns"));

        let (online, recheck) = cluster_status(
            Some(&waiting),
            "ns",
            Some(at(100)),
            summary(2, 2),
            false,
            None,
            Some(1),
            at(130),
            after,
        );
        assert_eq!(online.display.as_ref().unwrap().state, "Ready");
        assert!(conditions::is_true(
            &online.conditions,
            TYPE_AGENT_CONNECTED
        ));
        assert_eq!(recheck, Some(Duration::from_secs(61)), "re-check at expiry");

        let (again, _) = cluster_status(
            Some(&online),
            "ns",
            Some(at(120)),
            summary(2, 2),
            false,
            None,
            Some(1),
            at(140),
            after,
        );
        assert_eq!(again, online, "a fresh heartbeat alone changes nothing");

        let (offline, recheck) = cluster_status(
            Some(&online),
            "ns",
            Some(at(100)),
            summary(2, 2),
            false,
            None,
            Some(1),
            at(200),
            after,
        );
        assert_eq!(offline.display.as_ref().unwrap().state, "Offline");
        let ready = conditions::find_condition(&offline.conditions, TYPE_READY).unwrap();
        assert_eq!(ready.reason, reason::AGENT_OFFLINE);
        assert!(recheck.is_none());

        let (not_ready, _) = cluster_status(
            Some(&online),
            "ns",
            Some(at(100)),
            summary(2, 1),
            false,
            None,
            Some(1),
            at(110),
            after,
        );
        assert_eq!(not_ready.display.as_ref().unwrap().ready_bundles, "1/2");
        assert!(!conditions::is_true(&not_ready.conditions, TYPE_READY));
    }

    #[test]
    fn status_key_ignores_transition_times_only() {
        let status = |now, desired| {
            cluster_status(
                None,
                "ns",
                None,
                summary(desired, 0),
                false,
                None,
                Some(1),
                at(now),
                Duration::from_secs(90),
            )
            .0
        };
        assert_ne!(status(100, 1), status(101, 1), "the times differ");
        assert_eq!(status_key(&status(100, 1)), status_key(&status(101, 1)));
        assert_ne!(status_key(&status(100, 1)), status_key(&status(100, 2)));
    }

    #[test]
    fn heartbeat_is_the_later_of_lease_and_last_seen() {
        let mut c = Cluster::new("c", Default::default());
        assert_eq!(last_heartbeat(&c, None), None);
        assert_eq!(last_heartbeat(&c, Some(at(5))), Some(at(5)));
        c.status = Some(ClusterStatus {
            agent: Some(tender_types::AgentStatus {
                last_seen: Some(Time(at(9))),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(last_heartbeat(&c, Some(at(5))), Some(at(9)));
        assert_eq!(last_heartbeat(&c, Some(at(12))), Some(at(12)));
    }

    #[test]
    fn push_state_drives_cluster_connected_ready_and_mode() {
        let after = Duration::from_secs(90);
        let status = |existing: Option<&ClusterStatus>, push: Option<&PushState>, heartbeat| {
            cluster_status(
                existing,
                "ns",
                heartbeat,
                summary(1, 1),
                false,
                push,
                Some(1),
                at(100),
                after,
            )
            .0
        };
        let unreachable = PushState::Unreachable("no answer".into());
        let down = status(None, Some(&unreachable), Some(at(99)));
        assert_eq!(down.mode, Some(ClusterMode::Push));
        let connected =
            conditions::find_condition(&down.conditions, TYPE_CLUSTER_CONNECTED).unwrap();
        assert_eq!(
            (connected.status.as_str(), connected.reason.as_str()),
            ("False", "ClusterUnreachable")
        );
        let ready = conditions::find_condition(&down.conditions, TYPE_READY).unwrap();
        assert_eq!(
            ready.reason, "ClusterUnreachable",
            "unreachable wins over a fresh heartbeat"
        );
        assert_eq!(down.display.as_ref().unwrap().state, "ClusterUnreachable");

        for (state, reason) in [
            (
                PushState::KubeconfigMissing("x".into()),
                "KubeconfigMissing",
            ),
            (
                PushState::KubeconfigInvalid("x".into()),
                "KubeconfigInvalid",
            ),
            (
                PushState::ExecNotAllowed("x".into()),
                "KubeconfigExecNotAllowed",
            ),
            (PushState::Refused("x".into()), "KubeconfigRefused"),
        ] {
            let s = status(None, Some(&state), None);
            assert_eq!(
                conditions::find_condition(&s.conditions, TYPE_READY)
                    .unwrap()
                    .reason,
                reason
            );
        }

        let up = status(Some(&down), Some(&PushState::Connected), Some(at(99)));
        assert!(conditions::is_true(&up.conditions, TYPE_CLUSTER_CONNECTED));
        assert!(conditions::is_true(&up.conditions, TYPE_READY));
        assert_eq!(up.display.as_ref().unwrap().state, "Ready");
        assert_eq!(
            status(Some(&up), Some(&PushState::Connected), Some(at(99))),
            up,
            "nothing changed"
        );

        // Back to pull: the push condition goes, the mode says Pull.
        let pulled = status(Some(&up), None, Some(at(99)));
        assert_eq!(pulled.mode, Some(ClusterMode::Pull));
        assert!(conditions::find_condition(&pulled.conditions, TYPE_CLUSTER_CONNECTED).is_none());
        assert!(conditions::is_true(&pulled.conditions, TYPE_READY));
    }
}
