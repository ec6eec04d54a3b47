use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tender_types::rollout::{IntOrString, Partition};

use DeploymentState::{ErrApplied, Ready, WaitApplied};

fn strategy(on_failure: OnFailure) -> RolloutStrategy {
    let wave = |w: &str| Partition {
        name: Some(w.into()),
        cluster_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("wave".into(), w.into())])),
            ..Default::default()
        }),
        ..Default::default()
    };
    RolloutStrategy {
        partitions: vec![wave("1"), wave("2")],
        progress_deadline_seconds: Some(60),
        soak_seconds: Some(30),
        on_failure: Some(on_failure),
        ..Default::default()
    }
}

struct Fleet {
    labels: Vec<BTreeMap<String, String>>,
    names: Vec<String>,
    live: Vec<Option<(String, DeploymentState)>>,
}

impl Fleet {
    /// Clusters c0..c{n}: even ones in wave 1, odd ones in wave 2, one unpartitioned; all at "old".
    fn new(n: usize) -> Self {
        let mut labels = Vec::new();
        for i in 0..n {
            let mut l = BTreeMap::new();
            if i + 1 < n {
                l.insert("wave".to_string(), (1 + i % 2).to_string());
            }
            labels.push(l);
        }
        Self {
            labels,
            names: (0..n).map(|i| format!("c{i}")).collect(),
            live: vec![Some(("old".into(), Ready)); n],
        }
    }
    fn clusters(&self) -> Vec<ClusterRollout<'_>> {
        (0..self.names.len())
            .map(|i| ClusterRollout {
                name: &self.names[i],
                labels: &self.labels[i],
                desired: Some("new"),
                live: self.live[i].as_ref().map(|(id, s)| (id.as_str(), *s)),
            })
            .collect()
    }
    /// Applies the decisions: released clusters get "new" in `state`.
    fn apply(&mut self, gate: &Gate, state: DeploymentState) {
        for (i, name) in self.names.iter().enumerate() {
            match gate.decisions[name] {
                Decision::Release => self.live[i] = Some(("new".into(), state)),
                Decision::Rollback => self.live[i] = Some(("old".into(), Ready)),
                Decision::Hold => {}
            }
        }
    }
}

fn run(s: &RolloutStrategy, fleet: &Fleet, previous: Option<&State>, secs: i64) -> Gate {
    let now = secs * 1000;
    let inputs = Inputs {
        strategy: s,
        revision: "r2",
        previous,
        resume: None,
        rollback_possible: true,
        now,
    };
    gate(&inputs, &fleet.clusters(), &[]).unwrap()
}

fn released(g: &Gate) -> Vec<&str> {
    g.decisions
        .iter()
        .filter(|(_, d)| **d == Decision::Release)
        .map(|(c, _)| c.as_str())
        .collect()
}

#[test]
fn waves_release_in_order_after_ready_and_soak() {
    let s = strategy(OnFailure::Pause);
    let mut fleet = Fleet::new(5);
    let g = run(&s, &fleet, None, 0);
    assert_eq!(released(&g), ["c0", "c2"], "only wave 1");
    assert_eq!(g.snapshot, Vec::<String>::new(), "Pause keeps no revisions");
    assert_eq!(g.partitions.len(), 3, "unmatched clusters form a last wave");
    assert_eq!(g.partitions[2].name, "unpartitioned");
    fleet.apply(&g, WaitApplied);
    let g = run(&s, &fleet, Some(&g.state), 10);
    assert_eq!(released(&g), ["c0", "c2"]);
    assert_eq!(g.next, Some(Duration::from_secs(50)), "the deadline");
    fleet.apply(&g, Ready);
    // Ready at 20: soaks until 50, wave 2 waits.
    let g = run(&s, &fleet, Some(&g.state), 20);
    assert_eq!(released(&g), ["c0", "c2"]);
    assert_eq!(g.partitions[0].phase, "Soaking");
    assert_eq!(g.next, Some(Duration::from_secs(30)));
    let g = run(&s, &fleet, Some(&g.state), 49);
    assert_eq!(released(&g), ["c0", "c2"], "soak not over");
    let g = run(&s, &fleet, Some(&g.state), 50);
    assert_eq!(released(&g), ["c0", "c1", "c2", "c3"]);
    fleet.apply(&g, Ready);
    // Wave 2 seen ready at 80: the last wave is released at 110.
    let g = run(&s, &fleet, Some(&g.state), 80);
    assert_eq!(released(&g).len(), 4);
    let g = run(&s, &fleet, Some(&g.state), 110);
    assert_eq!(released(&g).len(), 5, "last wave after its soak");
    fleet.apply(&g, Ready);
    let g = run(&s, &fleet, Some(&g.state), 111);
    let g = run(&s, &fleet, Some(&g.state), 141);
    assert!(g.state.complete);
    // Complete and idle: the same state, nothing to wake up for.
    let again = run(&s, &fleet, Some(&g.state), 500);
    assert_eq!(again.state, g.state);
    assert_eq!(again.next, None);
    assert_eq!(again.conditions[0].2, reason::ROLLOUT_COMPLETE);
    // A cluster that goes unready afterwards does not fail a completed rollout.
    fleet.live[0] = Some(("new".into(), ErrApplied));
    assert_eq!(run(&s, &fleet, Some(&g.state), 600).state.failed, None);
}

#[test]
fn deadline_fails_the_wave_and_rollback_returns_it() {
    let s = strategy(OnFailure::Rollback);
    let mut fleet = Fleet::new(5);
    let g = run(&s, &fleet, None, 0);
    assert_eq!(
        g.snapshot,
        ["c0", "c2"],
        "previous revision kept before release"
    );
    fleet.apply(&g, DeploymentState::NotReady);
    let g = run(&s, &fleet, Some(&g.state), 59);
    assert_eq!(g.state.failed, None);
    let g = run(&s, &fleet, Some(&g.state), 60);
    let failure = g.state.failed.clone().unwrap();
    assert_eq!(
        (failure.wave, failure.reason.as_str()),
        (0, reason::PROGRESS_DEADLINE_EXCEEDED)
    );
    assert!(g.state.rolled_back);
    assert_eq!(g.decisions["c0"], Decision::Rollback);
    assert_eq!(g.decisions["c1"], Decision::Hold, "wave 2 never released");
    assert!(
        g.events
            .iter()
            .any(|e| e.warning && e.reason == reason::ROLLED_BACK)
    );
    fleet.apply(&g, Ready);
    // It stays rolled back and halted, however long.
    let later = run(&s, &fleet, Some(&g.state), 10_000);
    assert_eq!(later.decisions["c1"], Decision::Hold);
    assert_eq!(later.decisions["c0"], Decision::Rollback);
    assert_eq!(later.state, g.state);
    assert!(later.conditions.iter().any(|c| c.0 == "RolledBack" && c.1));
}

#[test]
fn failure_budget_pauses_and_resume_continues() {
    let s = strategy(OnFailure::Pause);
    let mut fleet = Fleet::new(5);
    let g = run(&s, &fleet, None, 0);
    fleet.apply(&g, ErrApplied);
    let g = run(&s, &fleet, Some(&g.state), 4);
    assert_eq!(
        g.state.failed, None,
        "a failure right after release may be a moment's"
    );
    let g = run(&s, &fleet, Some(&g.state), 5);
    assert_eq!(
        g.state.failed.as_ref().unwrap().reason,
        reason::FAILURE_BUDGET_EXCEEDED
    );
    assert!(!g.state.rolled_back);
    assert_eq!(
        g.decisions["c0"],
        Decision::Release,
        "Pause leaves the wave as it is"
    );
    assert_eq!(g.decisions["c1"], Decision::Hold);
    let halted = g
        .conditions
        .iter()
        .find(|c| c.0 == "RolloutHalted")
        .unwrap();
    assert!(halted.1);
    // Fixed downstream, still halted until resumed.
    fleet.apply(&g, Ready);
    let g = run(&s, &fleet, Some(&g.state), 100);
    assert_eq!(g.decisions["c1"], Decision::Hold);
    let inputs = Inputs {
        strategy: &s,
        revision: "r2",
        previous: Some(&g.state),
        resume: Some("t1"),
        rollback_possible: true,
        now: 100_000,
    };
    let g = gate(&inputs, &fleet.clusters(), &[]).unwrap();
    assert_eq!(g.state.failed, None);
    assert_eq!(g.state.resume.as_deref(), Some("t1"));
    let g = run_resumed(&s, &fleet, &g.state, 130);
    assert_eq!(
        g.decisions["c1"],
        Decision::Release,
        "wave 2 after wave 1's soak"
    );
}

fn run_resumed(s: &RolloutStrategy, fleet: &Fleet, state: &State, secs: i64) -> Gate {
    let now = secs * 1000;
    let inputs = Inputs {
        strategy: s,
        revision: "r2",
        previous: Some(state),
        resume: Some("t1"),
        rollback_possible: true,
        now,
    };
    gate(&inputs, &fleet.clusters(), &[]).unwrap()
}

#[test]
fn new_clusters_are_created_and_current_ones_hold_nothing() {
    let s = strategy(OnFailure::Pause);
    let mut fleet = Fleet::new(5);
    fleet.live[1] = None;
    let g = run(&s, &fleet, None, 0);
    assert_eq!(
        g.decisions["c1"],
        Decision::Release,
        "no BundleDeployment yet"
    );
    assert_eq!(g.decisions["c3"], Decision::Hold);
}

#[test]
fn auto_partitions_round_up() {
    let s = RolloutStrategy {
        auto_partition_size: Some(IntOrString::String("10%".into())),
        ..Default::default()
    };
    let fleet = Fleet::new(5);
    let w = waves(&s, &fleet.clusters(), &[]).unwrap();
    assert_eq!(w.len(), 5, "10% of 5 is one cluster per wave, never zero");
    let none = RolloutStrategy::default();
    assert_eq!(waves(&none, &fleet.clusters(), &[]).unwrap().len(), 1);
    let bad = RolloutStrategy {
        max_unavailable: Some(IntOrString::String("lots".into())),
        ..Default::default()
    };
    assert!(waves(&bad, &fleet.clusters(), &[]).is_err());
}

#[test]
fn auto_partition_threshold_keeps_one_wave_below_it() {
    let fleet = Fleet::new(5);
    let sized = |threshold: Option<i32>| RolloutStrategy {
        auto_partition_size: Some(IntOrString::Int(2)),
        auto_partition_threshold: threshold,
        ..Default::default()
    };
    let count = |s: &RolloutStrategy| waves(s, &fleet.clusters(), &[]).unwrap().len();
    assert_eq!(
        count(&sized(None)),
        3,
        "unset: the size applies at any count"
    );
    assert_eq!(
        count(&sized(Some(6))),
        1,
        "5 clusters, threshold 6: one wave"
    );
    assert_eq!(count(&sized(Some(5))), 3, "at the threshold: waves of 2");
    assert_eq!(
        count(&sized(Some(0))),
        1,
        "0 turns automatic waves off (Fleet)"
    );
    assert_eq!(count(&sized(Some(-1))), 1);
    let default_size = RolloutStrategy {
        auto_partition_threshold: Some(4),
        ..Default::default()
    };
    assert_eq!(
        count(&default_size),
        3,
        "25% of 5 rounded up: waves of 2, 2 and 1"
    );
}

#[test]
fn a_partition_with_several_fields_selects_where_all_hold() {
    let fleet = Fleet::new(5);
    let p = Partition {
        name: Some("c2-in-wave-1".into()),
        cluster_name: Some("c2".into()),
        cluster_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("wave".into(), "1".into())])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let none = Partition {
        name: Some("none".into()),
        ..Default::default()
    };
    let s = RolloutStrategy {
        partitions: vec![p, none],
        ..Default::default()
    };
    let w = waves(&s, &fleet.clusters(), &[]).unwrap();
    let names: Vec<_> = w.iter().map(|(n, m, _)| (n.as_str(), m.len())).collect();
    assert_eq!(
        names,
        [("c2-in-wave-1", 1), ("none", 0), ("unpartitioned", 4)],
        "both fields hold for c2 only; a partition with no field selects nothing"
    );
}
