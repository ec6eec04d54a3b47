//! Folding BundleDeployment states into Bundle status (the counts themselves are
//! [`crate::summary`]'s). Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;
use tender_types::conditions::{self, TYPE_READY, TYPE_RESOURCES_COPIED, reason};

use crate::summary::summary_reason;
use tender_types::{
    BundleDisplay, BundleShardStatus, BundleStatus, BundleSummary, UpstreamPublication,
};

/// A shard replica's entry of `status.shards`: its own Clusters' counts and reverse-sync lines.
pub fn shard_entry(
    id: &str,
    generation: Option<i64>,
    summary: &BundleSummary,
    upstream: Vec<UpstreamPublication>,
) -> BundleShardStatus {
    BundleShardStatus {
        id: id.to_string(),
        observed_generation: generation,
        summary: summary.clone(),
        upstream,
    }
}

/// The unsharded replica's view of a Bundle: its own counts plus every shard entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folded {
    /// Counts over every shard (`desired_ready` is the number of matched clusters).
    pub summary: BundleSummary,
    /// The shards' reverse-sync lines.
    pub upstream: Vec<UpstreamPublication>,
}

/// Folds the shard `entries` into the unsharded replica's `own` summary. Only entries of
/// shards in `serving` (shard ids some Cluster of the workspace is labelled with) count: a
/// shard whose last Cluster left it, or that was retired, leaves an entry nobody updates.
pub fn fold_shards(
    own: &BundleSummary,
    entries: &[BundleShardStatus],
    serving: &BTreeSet<String>,
) -> Folded {
    let mut out = Folded {
        summary: own.clone(),
        upstream: Vec::new(),
    };
    for e in entries.iter().filter(|e| serving.contains(&e.id)) {
        let (s, add) = (&mut out.summary, &e.summary);
        s.desired_ready = s.desired_ready.saturating_add(add.desired_ready);
        s.ready = s.ready.saturating_add(add.ready);
        s.wait_applied = s.wait_applied.saturating_add(add.wait_applied);
        s.err_applied = s.err_applied.saturating_add(add.err_applied);
        s.modified = s.modified.saturating_add(add.modified);
        s.not_ready = s.not_ready.saturating_add(add.not_ready);
        s.pending = s.pending.saturating_add(add.pending);
        out.upstream.extend(e.upstream.iter().cloned());
    }
    out
}

/// What the Bundle controller found, in the words its status uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleFacts {
    /// A target or group selector cannot be evaluated.
    pub targeting_error: Option<String>,
    /// Number of matched clusters.
    pub matched: usize,
    /// Missing sources (`Kind/name`), sorted.
    pub missing: Vec<String>,
    /// The Bundle's copies would hold (bytes, limit) over `--max-copied-bytes-per-bundle`.
    pub copy_limit: Option<(usize, usize)>,
    /// Sources never copied (`Kind/name`): Secrets a Cluster names, ServiceAccount tokens.
    pub refused: Vec<String>,
    /// Unsupported entries (`Kind/name`), sorted.
    pub unsupported: Vec<String>,
    /// Clusters whose BundleDeployment the apiserver refused to store for its size, sorted.
    pub too_large: Vec<String>,
    /// `downstreamResources` set but the copy feature is off.
    pub copy_disabled: bool,
    /// Clusters whose values template failed (`cluster: path: why`), sorted.
    pub template_failed: Vec<String>,
    /// Number of copies in place or written.
    pub copies: usize,
    /// `spec.paused`.
    pub paused: bool,
    /// BundleDeployments of matched clusters by state.
    pub summary: BundleSummary,
    /// `dependsOn` cannot be resolved (reason word, message): every cluster is held.
    pub dependency_error: Option<(&'static str, String)>,
    /// Clusters held back by `dependsOn`, each with what it waits for, sorted.
    pub held: Vec<(String, String)>,
    /// With a rolloutStrategy: the gate's view (waves, counts, conditions).
    pub rollout: Option<RolloutFacts>,
}

/// What a rollout shows in the Bundle's status (from [`super::rollout::Gate`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutFacts {
    /// `status.partitions`.
    pub partitions: Vec<tender_types::rollout::PartitionStatus>,
    /// `status.unavailable`.
    pub unavailable: usize,
    /// `status.unavailablePartitions`.
    pub unavailable_partitions: usize,
    /// `status.maxUnavailablePartitions`.
    pub max_unavailable_partitions: usize,
    /// RolloutProgressing / RolloutHalted / RolledBack, or an invalid strategy's message.
    pub conditions: Vec<super::rollout::RolloutCondition>,
}

/// The part of a Bundle's status the Bundle controller applies: without the shard entries
/// (each shard replica's own) and the poll controller's `version`, `Polled` and `PollingInterval`
/// (decision 0113-chart-polling-controller).
pub(crate) fn ours(mut status: BundleStatus) -> BundleStatus {
    status.shards.clear();
    status.version = None;
    status.conditions.retain(|c| {
        c.type_ != tender_types::conditions::TYPE_POLLED
            && c.type_ != tender_types::conditions::TYPE_POLLING_INTERVAL
    });
    status
}

/// The Bundle status for `facts`, starting from `existing` so condition transition times are
/// kept and an unchanged result compares equal (no write).
pub fn bundle_status(
    existing: Option<&BundleStatus>,
    facts: &BundleFacts,
    generation: Option<i64>,
    now: Time,
) -> BundleStatus {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    let s = &facts.summary;

    let (copied, copy_reason, copy_message) = copies_condition(facts);
    conditions::set_condition(
        &mut status.conditions,
        TYPE_RESOURCES_COPIED,
        copied,
        copy_reason,
        &copy_message,
        generation,
        now.clone(),
    );

    // Readiness, the most actionable problem first.
    let ready_count = format!("{}/{}", s.ready, facts.matched);
    let (ready, ready_reason, message, state) = if let Some(err) = &facts.targeting_error {
        (
            false,
            reason::INVALID_SELECTOR,
            err.clone(),
            "InvalidSelector",
        )
    } else if facts.matched == 0 {
        (
            false,
            reason::NO_CLUSTERS_MATCHED,
            "no target selects any Cluster in this namespace".to_string(),
            "NoClusters",
        )
    } else if copy_reason == reason::SOURCE_NOT_FOUND || copy_reason == reason::KIND_NOT_ALLOWED {
        (false, copy_reason, copy_message.clone(), "SourceNotFound")
    } else if !facts.template_failed.is_empty() {
        (
            false,
            reason::VALUES_TEMPLATE_FAILED,
            format!(
                "Helm values template failed for {}; nothing new is written for those clusters, what they have stays, the other clusters deploy",
                facts.template_failed.join("; ")
            ),
            "TemplateFailed",
        )
    } else if !facts.too_large.is_empty() {
        (
            false,
            reason::TOO_LARGE,
            format!(
                "the BundleDeployment for {} is larger than the hub's apiserver stores; what was deployed before stays: make the Bundle smaller or split it",
                facts.too_large.join(", ")
            ),
            "TooLarge",
        )
    } else if let Some((why, message)) = &facts.dependency_error {
        (false, *why, message.clone(), *why)
    } else if facts.paused {
        (
            false,
            reason::PAUSED,
            format!("rollout is paused; {ready_count} clusters ready"),
            "Paused",
        )
    } else if !facts.held.is_empty() {
        (
            false,
            reason::DEPENDENCY_NOT_READY,
            super::depends::held_message(&facts.held),
            "WaitingForDependencies",
        )
    } else if let Some((why, state)) = summary_reason(s) {
        (
            false,
            why,
            format!(
                "{ready_count} clusters ready ({} pending, {} waiting to apply, {} failed, {} modified, {} not ready)",
                s.pending, s.wait_applied, s.err_applied, s.modified, s.not_ready
            ),
            state,
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
        now.clone(),
    );
    status.summary = Some(s.clone());
    rollout_status(&mut status, facts.rollout.as_ref(), generation, now);
    status.display = Some(BundleDisplay {
        ready_clusters: ready_count,
        state: state.to_string(),
    });
    status
}

/// The `ResourcesCopied` condition for `facts`: status, reason, message.
fn copies_condition(facts: &BundleFacts) -> (bool, &'static str, String) {
    if !facts.missing.is_empty() {
        (
            false,
            reason::SOURCE_NOT_FOUND,
            format!(
                "not found in the Bundle's namespace: {}; nothing is written for the clusters that need them until they exist",
                facts.missing.join(", ")
            ),
        )
    } else if let Some((bytes, limit)) = facts.copy_limit {
        (
            false,
            reason::COPY_LIMIT_EXCEEDED,
            format!(
                "the copies for every targeted cluster would hold {bytes} bytes on the hub, over the hub's limit of {limit} (--max-copied-bytes-per-bundle); nothing new is written, what is deployed stays"
            ),
        )
    } else if !facts.refused.is_empty() {
        (
            false,
            reason::SOURCE_REFUSED,
            format!(
                "never copied: {} (a Secret a Cluster names as its kubeconfig, or a ServiceAccount token); nothing is written for the clusters that need them",
                facts.refused.join(", ")
            ),
        )
    } else if !facts.unsupported.is_empty() {
        (
            false,
            reason::KIND_NOT_ALLOWED,
            format!(
                "kind not allowed by the hub operator (--copyable-kinds): {}; nothing is written for the clusters that need them",
                facts.unsupported.join(", ")
            ),
        )
    } else if facts.copy_disabled {
        (
            false,
            reason::COPY_FEATURE_DISABLED,
            "downstreamResources is ignored: EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM is off on the hub, so nothing is copied".to_string(),
        )
    } else if facts.copies == 0 {
        (true, reason::NO_RESOURCES_TO_COPY, String::new())
    } else {
        (
            true,
            reason::RESOURCES_COPIED,
            format!("{} copies in place", facts.copies),
        )
    }
}

impl RolloutFacts {
    /// The status of a gate's answer.
    pub fn of(gate: &super::rollout::Gate) -> Self {
        Self {
            partitions: gate.partitions.clone(),
            unavailable: gate.unavailable,
            unavailable_partitions: gate.unavailable_partitions,
            max_unavailable_partitions: gate.max_unavailable_partitions,
            conditions: gate.conditions.clone(),
        }
    }

    /// A halted gate (an invalid strategy or kept state), with its message.
    pub(crate) fn halted(halt: &super::waves::Halt) -> Self {
        use super::waves::Halt;
        use tender_types::conditions::TYPE_ROLLOUT_HALTED;
        let (reason, message) = match halt {
            Halt::InvalidStrategy(m) => (
                reason::INVALID_ROLLOUT_STRATEGY,
                format!("rolloutStrategy: {m}; nothing already deployed is updated"),
            ),
            Halt::InvalidState(m) => (
                reason::ROLLOUT_STATE_INVALID,
                format!(
                    "the rollout state the hub keeps is not valid ({m}); nothing already \
                     deployed is updated or rolled back until an administrator deletes it \
                     (docs/rollouts.md)"
                ),
            ),
        };
        Self {
            conditions: vec![(TYPE_ROLLOUT_HALTED, true, reason, message)],
            ..Self::default()
        }
    }
}

/// The rollout part of the status: Fleet's counts, the waves and the three conditions; all
/// absent without a rolloutStrategy.
fn rollout_status(
    status: &mut BundleStatus,
    rollout: Option<&RolloutFacts>,
    generation: Option<i64>,
    now: Time,
) {
    use tender_types::conditions::{
        TYPE_ROLLED_BACK, TYPE_ROLLOUT_HALTED, TYPE_ROLLOUT_PROGRESSING,
    };
    let to_i32 = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    let Some(r) = rollout else {
        status.unavailable = None;
        status.unavailable_partitions = None;
        status.max_unavailable_partitions = None;
        status.partitions = Vec::new();
        status.conditions.retain(|c| {
            ![
                TYPE_ROLLOUT_PROGRESSING,
                TYPE_ROLLOUT_HALTED,
                TYPE_ROLLED_BACK,
            ]
            .contains(&c.type_.as_str())
        });
        return;
    };
    status.unavailable = to_i32(r.unavailable);
    status.unavailable_partitions = to_i32(r.unavailable_partitions);
    status.max_unavailable_partitions = to_i32(r.max_unavailable_partitions);
    status.partitions = r.partitions.clone();
    for (type_, ok, why, message) in &r.conditions {
        conditions::set_condition(
            &mut status.conditions,
            type_,
            *ok,
            why,
            message,
            generation,
            now.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{DeploymentState, classify, summarize};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;
    use tender_types::BundleDeployment;
    use tender_types::conditions::{TYPE_DEPLOYED, find_condition};
    use tender_types::{BundleDeploymentSpec, BundleDeploymentStatus, ObjectRef};

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn cond(type_: &str, status: bool, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at(0),
        }
    }

    fn bd(id: &str, status: Option<BundleDeploymentStatus>) -> BundleDeployment {
        let mut bd = BundleDeployment::new(
            "b",
            BundleDeploymentSpec {
                deployment_id: id.into(),
                ..Default::default()
            },
        );
        bd.status = status;
        bd
    }

    fn reported(applied: &str, conditions: Vec<Condition>) -> Option<BundleDeploymentStatus> {
        Some(BundleDeploymentStatus {
            applied_deployment_id: Some(applied.into()),
            conditions,
            ..Default::default()
        })
    }

    fn counts(desired: i32, ready: i32, pending: i32, err: i32) -> BundleSummary {
        BundleSummary {
            desired_ready: desired,
            ready,
            pending,
            err_applied: err,
            ..Default::default()
        }
    }

    #[test]
    fn dependencies_name_their_reason_before_the_counts() {
        let base = BundleFacts {
            matched: 2,
            summary: counts(2, 2, 0, 0),
            ..Default::default()
        };
        let ready = |s: &BundleStatus| {
            let c = find_condition(&s.conditions, TYPE_READY).unwrap().clone();
            (c.status, c.reason, c.message)
        };
        let cycle = BundleFacts {
            dependency_error: Some((reason::DEPENDENCY_CYCLE, "b -> a -> b".into())),
            ..base.clone()
        };
        let s = bundle_status(None, &cycle, Some(1), at(1));
        assert_eq!(
            ready(&s),
            (
                "False".into(),
                reason::DEPENDENCY_CYCLE.into(),
                "b -> a -> b".into()
            )
        );
        // Held clusters: not ready even though every existing BundleDeployment is.
        let held = BundleFacts {
            held: vec![("two".into(), "a: NotReady".into())],
            ..base.clone()
        };
        let (status, why, message) = ready(&bundle_status(None, &held, Some(1), at(1)));
        assert_eq!(
            (status.as_str(), why.as_str()),
            ("False", reason::DEPENDENCY_NOT_READY)
        );
        assert!(message.contains("two (a: NotReady)"), "{message}");
        // Nothing held: Ready as before.
        assert_eq!(
            ready(&bundle_status(None, &base, Some(1), at(1))).1,
            reason::READY
        );
    }

    #[test]
    fn shard_entries_fold_into_the_unsharded_summary() {
        let own = counts(2, 2, 0, 0);
        let entries = vec![
            shard_entry("a", Some(3), &counts(3, 1, 2, 0), Vec::new()),
            shard_entry("b", Some(3), &counts(4, 3, 0, 1), Vec::new()),
        ];
        let serving = BTreeSet::from(["a".to_string(), "b".to_string()]);
        let folded = fold_shards(&own, &entries, &serving);
        assert_eq!(folded.summary, counts(9, 6, 2, 1));
        // The folded counts drive the conditions like an unsharded hub's own.
        let facts = BundleFacts {
            matched: 9,
            summary: folded.summary,
            ..Default::default()
        };
        let status = bundle_status(None, &facts, Some(3), at(1));
        assert_eq!(status.display.unwrap().ready_clusters, "6/9");
        assert!(!conditions::is_true(&status.conditions, TYPE_READY));
    }

    #[test]
    fn entries_of_shards_without_clusters_are_not_counted() {
        let own = counts(1, 1, 0, 0);
        let entries = vec![
            shard_entry("a", Some(1), &counts(2, 2, 0, 0), Vec::new()),
            shard_entry("gone", Some(1), &counts(5, 0, 5, 0), Vec::new()),
        ];
        let serving = BTreeSet::from(["a".to_string()]);
        assert_eq!(
            fold_shards(&own, &entries, &serving).summary,
            counts(3, 3, 0, 0)
        );
        // No shards at all: the unsharded replica's own counts, unchanged.
        assert_eq!(
            fold_shards(&own, &[], &BTreeSet::new()).summary,
            own,
            "unsharded hub"
        );
    }

    #[test]
    fn classifies_agent_reports() {
        assert_eq!(classify(&bd("a", None)), DeploymentState::Pending);
        assert_eq!(
            classify(&bd(
                "b",
                reported("a", vec![cond(TYPE_READY, true, "Ready")])
            )),
            DeploymentState::WaitApplied
        );
        assert_eq!(
            classify(&bd(
                "a",
                reported("a", vec![cond(TYPE_READY, true, "Ready")])
            )),
            DeploymentState::Ready
        );
        assert_eq!(
            classify(&bd(
                "a",
                reported("a", vec![cond(TYPE_READY, false, "NotReady")])
            )),
            DeploymentState::NotReady
        );
        assert_eq!(
            classify(&bd(
                "b",
                reported("a", vec![cond(TYPE_DEPLOYED, false, reason::APPLY_FAILED)])
            )),
            DeploymentState::ErrApplied
        );
        // Every specific reason of the agent is a failure; waiting and pausing are not.
        for (type_, why, state) in [
            (
                TYPE_DEPLOYED,
                reason::KIND_NOT_INSTALLED,
                DeploymentState::ErrApplied,
            ),
            (
                TYPE_DEPLOYED,
                reason::NAMESPACE_TERMINATING,
                DeploymentState::ErrApplied,
            ),
            (
                TYPE_DEPLOYED,
                reason::CHART_RENDER_FAILED,
                DeploymentState::ErrApplied,
            ),
            (
                TYPE_RESOURCES_COPIED,
                reason::KIND_NOT_INSTALLED,
                DeploymentState::ErrApplied,
            ),
            (
                TYPE_DEPLOYED,
                reason::WAIT_APPLIED,
                DeploymentState::WaitApplied,
            ),
            (TYPE_DEPLOYED, reason::PAUSED, DeploymentState::WaitApplied),
            (
                TYPE_RESOURCES_COPIED,
                reason::REFUSED_BY_POLICY,
                DeploymentState::WaitApplied,
            ),
            (
                TYPE_READY,
                reason::KIND_NOT_INSTALLED,
                DeploymentState::ErrApplied,
            ),
        ] {
            assert_eq!(
                classify(&bd("b", reported("a", vec![cond(type_, false, why)]))),
                state,
                "{type_}={why}"
            );
        }
        let mut modified = reported("a", vec![cond(TYPE_READY, true, "Ready")]);
        modified.as_mut().unwrap().modified = vec![ObjectRef::default()];
        assert_eq!(classify(&bd("a", modified)), DeploymentState::Modified);
    }

    #[test]
    fn summary_counts_missing_deployments_as_pending() {
        let bds = [
            bd("a", reported("a", vec![cond(TYPE_READY, true, "Ready")])),
            bd("b", reported("a", vec![])),
        ];
        let s = summarize(4, &bds);
        assert_eq!(
            (s.desired_ready, s.ready, s.wait_applied, s.pending),
            (4, 1, 1, 2)
        );
        assert_eq!(
            summary_reason(&s),
            Some((reason::WAIT_APPLIED, "WaitApplied"))
        );
        let all_ready = summarize(1, &bds[..1]);
        assert_eq!(summary_reason(&all_ready), None);
    }

    fn facts(matched: usize, ready: i32) -> BundleFacts {
        BundleFacts {
            matched,
            summary: BundleSummary {
                desired_ready: matched as i32,
                ready,
                pending: matched as i32 - ready,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn ready_when_every_cluster_is_ready_and_stable_when_unchanged() {
        let status = bundle_status(None, &facts(2, 2), Some(1), at(10));
        let ready = find_condition(&status.conditions, TYPE_READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Ready")
        );
        assert_eq!(status.display.as_ref().unwrap().ready_clusters, "2/2");
        let again = bundle_status(Some(&status), &facts(2, 2), Some(1), at(99));
        assert_eq!(
            again, status,
            "unchanged facts give an equal status (no write)"
        );
    }

    #[test]
    fn reasons_in_order_of_what_to_fix_first() {
        let get = |f: &BundleFacts| {
            let s = bundle_status(None, f, None, at(0));
            let ready = find_condition(&s.conditions, TYPE_READY).unwrap().clone();
            let copied = find_condition(&s.conditions, TYPE_RESOURCES_COPIED)
                .unwrap()
                .clone();
            (ready, copied)
        };
        let (ready, _) = get(&facts(0, 0));
        assert_eq!(ready.reason, reason::NO_CLUSTERS_MATCHED);

        let mut missing = facts(3, 0);
        missing.missing = vec!["Secret/creds".into()];
        let (ready, copied) = get(&missing);
        assert_eq!(ready.reason, reason::SOURCE_NOT_FOUND);
        assert_eq!(copied.reason, reason::SOURCE_NOT_FOUND);
        assert!(
            copied.message.contains("Secret/creds"),
            "{}",
            copied.message
        );

        let mut disabled = facts(3, 3);
        disabled.copy_disabled = true;
        let (ready, copied) = get(&disabled);
        assert_eq!(ready.status, "True", "gate off does not block readiness");
        assert_eq!(copied.reason, reason::COPY_FEATURE_DISABLED);
        assert!(copied.message.contains("ignored"));

        let mut invalid = facts(0, 0);
        invalid.targeting_error = Some("targets[0]: bad".into());
        assert_eq!(get(&invalid).0.reason, reason::INVALID_SELECTOR);

        let mut paused = facts(2, 1);
        paused.paused = true;
        assert_eq!(get(&paused).0.reason, reason::PAUSED);

        let mut too_large = facts(2, 1);
        too_large.too_large = vec!["east".into()];
        too_large.paused = true;
        let (ready, _) = get(&too_large);
        assert_eq!(
            ready.reason,
            reason::TOO_LARGE,
            "before paused: nothing can roll out"
        );
        assert!(ready.message.contains("east"), "{}", ready.message);

        let (ready, copied) = get(&facts(2, 1));
        assert_eq!(ready.reason, reason::WAIT_APPLIED);
        assert_eq!(copied.reason, reason::NO_RESOURCES_TO_COPY);
    }
}
