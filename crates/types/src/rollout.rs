//! `rolloutStrategy`: rollouts in waves (Fleet's field names), with tender's progress deadline,
//! soak time, failure budget and automatic rollback (docs/rollouts.md). Types and the pure
//! arithmetic of their values; the hub's gate is `tender_hub::bundle::rollout`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
pub use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a change reaches the targeted clusters: in waves (partitions), each released only once
/// the earlier ones are ready and have soaked. Without it every cluster gets a change at once.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::fleet_only::rollout_strategy)]
pub struct RolloutStrategy {
    /// Clusters of a wave that may be unavailable (not ready at the new deployment) while the wave still counts as done: a number or a percentage of the wave, rounded up. Default 0 (Fleet: 100%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,

    /// Released waves that may be not done while the next one is released: a number or a percentage of the waves, rounded up. Default 0: one wave at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable_partitions: Option<IntOrString>,

    /// Without `partitions`: the size of each automatic wave, a number or a percentage of the targeted clusters, rounded up and at least 1. Unset: one wave below 200 clusters, 25% from 200 on (Fleet's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_partition_size: Option<IntOrString>,

    /// Without `partitions`: below this many targeted clusters there is one wave, whatever `autoPartitionSize` says; `0` or less: always one wave (Fleet's field and rule). Unset: `autoPartitionSize` applies at any count, and without it automatic waves start at 200 clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_partition_threshold: Option<i32>,

    /// The waves, in order. A cluster belongs to the first partition that selects it; clusters no partition selects form a last wave of their own (Fleet never deploys them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub partitions: Vec<Partition>,

    /// Seconds a released wave has to become ready; a wave not ready in time has failed. Unset: no deadline (a wave waits for ever, as in Fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub progress_deadline_seconds: Option<u32>,

    /// Seconds a wave must stay ready before the next one is released (OCM's minSuccessTime). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub soak_seconds: Option<u32>,

    /// Clusters of the released waves that may fail (ErrApplied at the new deployment) before the rollout has failed, without waiting for the deadline. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_failures: Option<u32>,

    /// What a failed rollout does: `Pause` (default) holds every wave not yet released; `Rollback` also returns the failed wave's clusters to their previous revision (copies and BundleDeployment). Resume with `tender rollout resume` or a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
}

/// What a failed rollout does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OnFailure {
    /// Hold the waves not yet released; what is deployed stays.
    #[default]
    Pause,
    /// Hold, and return the failed wave's clusters to their previous revision.
    Rollback,
}

/// One wave: the clusters it selects, with a target's selector fields and their meaning (Fleet's:
/// every field set must hold; none set selects nothing).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// Name of the wave, for status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// Overrides the strategy's maxUnavailable for this wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Selects the Cluster with this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cluster_name: Option<String>,
    /// Selects Clusters by their labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// Selects the Clusters of the ClusterGroup with this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cluster_group: Option<String>,
    /// Selects the Clusters of every ClusterGroup whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group_selector: Option<LabelSelector>,
}

/// One wave as the Bundle's status reports it (Fleet's `partitions[]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PartitionStatus {
    /// Name of the wave.
    pub name: String,
    /// Clusters in the wave.
    pub count: i32,
    /// Clusters of the wave that may be unavailable.
    pub max_unavailable: i32,
    /// Clusters of the wave not ready at the deployment the Bundle wants.
    pub unavailable: i32,
    /// `Waiting` (not released), `Progressing`, `Soaking`, `Done`, `Failed` or `RolledBack`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
}

/// An invalid `maxUnavailable`-style value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid count or percentage {0:?}: expected a number or a string like \"25%\"")]
pub struct InvalidValue(pub String);

/// A count or percentage of `total`, percentages rounded up (so a non-zero percentage of a
/// non-empty set is at least 1: Fleet's rounding to zero is a trap); `default` when unset.
pub fn scaled(
    value: Option<&IntOrString>,
    total: usize,
    default: usize,
) -> Result<usize, InvalidValue> {
    match value {
        None => Ok(default),
        Some(IntOrString::Int(n)) => Ok(usize::try_from(*n).unwrap_or(0)),
        Some(IntOrString::String(s)) => {
            let Some(pct) = s.strip_suffix('%') else {
                return s.parse().map_err(|_| InvalidValue(s.clone()));
            };
            let pct: usize = pct.parse().map_err(|_| InvalidValue(s.clone()))?;
            if pct > 100 {
                return Err(InvalidValue(s.clone()));
            }
            Ok((total * pct).div_ceil(100))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_up() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(scaled(Some(&pct("10%")), 5, 0), Ok(1));
        assert_eq!(scaled(Some(&pct("25%")), 12, 0), Ok(3));
        assert_eq!(scaled(Some(&pct("0%")), 12, 9), Ok(0));
        assert_eq!(scaled(Some(&IntOrString::Int(2)), 12, 0), Ok(2));
        assert_eq!(scaled(Some(&pct("3")), 12, 0), Ok(3));
        assert_eq!(scaled(None, 12, 7), Ok(7));
        assert!(scaled(Some(&pct("x%")), 12, 0).is_err());
        assert!(scaled(Some(&pct("120%")), 12, 0).is_err());
    }
}
