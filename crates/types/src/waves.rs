//! Which wave of a `rolloutStrategy` each targeted cluster is in (docs/rollouts.md): the
//! hub's rollout gate and `tender status` compute it the same way. Clusters are taken in
//! name order, so a wave's members do not depend on the order a cache lists them in (an
//! automatic wave is a run of names), nor change when the hub restarts.

use crate::rollout::{IntOrString, RolloutStrategy, scaled};
use crate::targeting::{ClusterInfo, Criteria, GroupInfo, TargetingError, criteria_select};

/// Below this many clusters, no `autoPartitionSize` means one wave (Fleet's rule).
pub const AUTO_PARTITION_MIN: usize = 200;
/// Fleet's default `autoPartitionSize`, in percent.
const AUTO_PARTITION_PERCENT: usize = 25;

/// One wave: its name, its clusters (indices into the clusters given, in name order) and how
/// many of them may be unavailable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// `partitions[].name`, `partition-<n>`, `auto-<n>` or `unpartitioned`.
    pub name: String,
    /// Indices of its clusters in the slice given to [`waves`].
    pub members: Vec<usize>,
    /// Its `maxUnavailable`, as a count.
    pub max_unavailable: usize,
}

/// Why a strategy cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidStrategy(pub String);

/// Splits `clusters` (the targeted ones) into the waves of `strategy`.
pub fn waves(
    strategy: &RolloutStrategy,
    clusters: &[ClusterInfo<'_>],
    groups: &[GroupInfo<'_>],
) -> Result<Vec<Wave>, InvalidStrategy> {
    let invalid = |e: &dyn std::fmt::Display| InvalidStrategy(e.to_string());
    let max = |value: Option<&IntOrString>, count: usize| {
        scaled(value.or(strategy.max_unavailable.as_ref()), count, 0).map_err(|e| invalid(&e))
    };
    let mut order: Vec<usize> = (0..clusters.len()).collect();
    order.sort_by_key(|&i| clusters[i].name);
    let mut out = Vec::new();
    if strategy.partitions.is_empty() {
        // Fleet's autoPartitionThreshold: below it (or when it is 0 or less) one wave.
        let n = clusters.len();
        let one_wave = match strategy.auto_partition_threshold {
            Some(t) => t <= 0 || n < usize::try_from(t).unwrap_or(usize::MAX),
            None => strategy.auto_partition_size.is_none() && n < AUTO_PARTITION_MIN,
        };
        let size = match &strategy.auto_partition_size {
            _ if one_wave => n,
            Some(v) => scaled(Some(v), n, n).map_err(|e| invalid(&e))?,
            None => (n * AUTO_PARTITION_PERCENT).div_ceil(100),
        }
        .max(1);
        for (i, chunk) in order.chunks(size).enumerate() {
            out.push(Wave {
                name: format!("auto-{}", i + 1),
                members: chunk.to_vec(),
                max_unavailable: max(None, chunk.len())?,
            });
        }
        return Ok(out);
    }
    let mut taken = vec![false; clusters.len()];
    for (i, p) in strategy.partitions.iter().enumerate() {
        let mut members = Vec::new();
        for &c in &order {
            if taken[c] {
                continue;
            }
            let selects = criteria_select(&Criteria::of_partition(p), &clusters[c], groups)
                .map_err(|e| {
                    invalid(
                        &e.into_targeting(|source| TargetingError::Partition { index: i, source }),
                    )
                })?;
            if selects {
                taken[c] = true;
                members.push(c);
            }
        }
        out.push(Wave {
            name: p
                .name
                .clone()
                .unwrap_or_else(|| format!("partition-{}", i + 1)),
            max_unavailable: max(p.max_unavailable.as_ref(), members.len())?,
            members,
        });
    }
    // Fleet never deploys a cluster no partition selects; tender makes them a last wave.
    let rest: Vec<usize> = order.into_iter().filter(|c| !taken[*c]).collect();
    if !rest.is_empty() {
        out.push(Wave {
            name: "unpartitioned".to_string(),
            max_unavailable: max(None, rest.len())?,
            members: rest,
        });
    }
    Ok(out)
}

/// The wave of each cluster, by index into `clusters` (`None`: the strategy is invalid).
pub fn wave_of_each(
    strategy: &RolloutStrategy,
    clusters: &[ClusterInfo<'_>],
    groups: &[GroupInfo<'_>],
) -> Option<Vec<String>> {
    let mut out = vec![String::new(); clusters.len()];
    for w in waves(strategy, clusters, groups).ok()? {
        for m in w.members {
            out[m].clone_from(&w.name);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn automatic_waves_are_runs_of_names_whatever_the_order_given() {
        let labels = BTreeMap::new();
        let names: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
        let strategy = RolloutStrategy {
            auto_partition_size: Some(IntOrString::Int(3)),
            ..Default::default()
        };
        let forward: Vec<ClusterInfo<'_>> = names
            .iter()
            .map(|n| ClusterInfo {
                name: n,
                labels: &labels,
            })
            .collect();
        let mut shuffled = forward.clone();
        shuffled.reverse();
        shuffled.swap(1, 5);
        let by_name = |cs: &[ClusterInfo<'_>]| -> BTreeMap<String, String> {
            let waves = wave_of_each(&strategy, cs, &[]).unwrap();
            cs.iter()
                .zip(waves)
                .map(|(c, w)| (c.name.to_string(), w))
                .collect()
        };
        let a = by_name(&forward);
        assert_eq!(a, by_name(&shuffled));
        assert_eq!(a["c0"], "auto-1");
        assert_eq!(a["c2"], "auto-1");
        assert_eq!(a["c3"], "auto-2");
        assert_eq!(a["c7"], "auto-3");
    }
}
