//! Gauges computed from the hub's caches when Prometheus scrapes: how many Clusters, Bundles
//! and BundleDeployments are in each state — what the charts' alerts and dashboard read.
//! Nothing is computed between scrapes (idle means idle). A replica exports them only while it
//! runs the controllers (a standby has no caches), and only the unsharded replica counts
//! Clusters and Bundles (every replica caches all of them; each caches only its own shard's
//! BundleDeployments, so those add up across replicas).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tender_types::conditions::{self, find_condition};
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterMode};

/// The caches one scope's controllers run on.
#[derive(Clone)]
struct Source {
    id: u64,
    clusters: Option<(Store<Cluster>, Store<Bundle>)>,
    bundle_deployments: Store<BundleDeployment>,
}

/// The hub's state gauges; registered once, fed by every running scope.
#[derive(Clone, Default)]
pub struct StateGauges(Arc<Mutex<(u64, Vec<Source>)>>);

impl std::fmt::Debug for StateGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateGauges")
    }
}

/// Removes its scope's caches from the gauges when dropped (the controllers stopped).
pub(crate) struct Attached(StateGauges, u64);

impl Drop for Attached {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.0.0.lock() {
            inner.1.retain(|s| s.id != self.1);
        }
    }
}

impl StateGauges {
    /// Counts from these caches until the returned guard is dropped. `clusters` is `None` on
    /// a shard replica.
    pub(crate) fn attach(
        &self,
        clusters: Option<(Store<Cluster>, Store<Bundle>)>,
        bundle_deployments: Store<BundleDeployment>,
    ) -> Attached {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        inner.0 += 1;
        let id = inner.0;
        inner.1.push(Source {
            id,
            clusters,
            bundle_deployments,
        });
        Attached(self.clone(), id)
    }

    fn counts(&self) -> Counts {
        let sources = self
            .0
            .lock()
            .map(|inner| inner.1.clone())
            .unwrap_or_default();
        let mut c = Counts::default();
        for s in &sources {
            if let Some((clusters, bundles)) = &s.clusters {
                c.add_clusters(&clusters.state());
                c.add_bundles(&bundles.state());
            }
            c.add_bundle_deployments(&s.bundle_deployments.state());
        }
        c
    }
}

type Labels = Vec<(&'static str, String)>;

/// The counts of one scrape, by label set.
#[derive(Debug, Default, PartialEq)]
struct Counts {
    clusters: BTreeMap<Labels, i64>,
    bundles: BTreeMap<Labels, i64>,
    bundle_conditions: BTreeMap<Labels, i64>,
    bundle_deployments: BTreeMap<Labels, i64>,
    not_ready: BTreeMap<Labels, i64>,
    any_clusters: bool,
}

/// `state` as shown, `Unknown` before the hub or agent has said.
fn state_or_unknown(state: Option<&str>) -> String {
    state
        .filter(|s| !s.is_empty())
        .unwrap_or("Unknown")
        .to_string()
}

/// The Bundle conditions an operator alerts on.
const BUNDLE_CONDITIONS: [&str; 4] = [
    conditions::TYPE_READY,
    conditions::TYPE_ROLLOUT_HALTED,
    conditions::TYPE_ROLLED_BACK,
    conditions::TYPE_POLLED,
];

impl Counts {
    fn add_clusters(&mut self, clusters: &[Arc<Cluster>]) {
        self.any_clusters = true;
        for cl in clusters {
            // Read in place: a scrape walks every cached object and copies only label values.
            let status = cl.status.as_ref();
            let mode = status
                .and_then(|s| s.mode)
                .unwrap_or_else(|| cl.spec.mode());
            let connection = match mode {
                ClusterMode::Pull => conditions::TYPE_AGENT_CONNECTED,
                ClusterMode::Push => conditions::TYPE_CLUSTER_CONNECTED,
            };
            let connected = status
                .and_then(|s| find_condition(&s.conditions, connection))
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into());
            let state = status
                .and_then(|s| s.display.as_ref())
                .map(|d| d.state.as_str());
            let labels = vec![
                ("state", state_or_unknown(state)),
                ("mode", mode.to_string()),
                ("connected", connected),
            ];
            *self.clusters.entry(labels).or_default() += 1;
        }
    }

    fn add_bundles(&mut self, bundles: &[Arc<Bundle>]) {
        for b in bundles {
            let Some(status) = b.status.as_ref() else {
                *self
                    .bundles
                    .entry(vec![("state", state_or_unknown(None))])
                    .or_default() += 1;
                continue;
            };
            let state = state_or_unknown(status.display.as_ref().map(|d| d.state.as_str()));
            *self.bundles.entry(vec![("state", state)]).or_default() += 1;
            for t in BUNDLE_CONDITIONS {
                if let Some(c) = find_condition(&status.conditions, t) {
                    let labels = vec![
                        ("type", t.to_string()),
                        ("status", c.status.clone()),
                        ("reason", c.reason.clone()),
                    ];
                    *self.bundle_conditions.entry(labels).or_default() += 1;
                }
            }
        }
    }

    fn add_bundle_deployments(&mut self, bds: &[Arc<BundleDeployment>]) {
        for bd in bds {
            let status = bd.status.as_ref();
            let state = status
                .and_then(|s| s.display.as_ref())
                .map(|d| d.state.as_str());
            *self
                .bundle_deployments
                .entry(vec![("state", state_or_unknown(state))])
                .or_default() += 1;
            if let Some(c) =
                status.and_then(|s| find_condition(&s.conditions, conditions::TYPE_READY))
                && c.status != "True"
            {
                *self
                    .not_ready
                    .entry(vec![("reason", c.reason.clone())])
                    .or_default() += 1;
            }
        }
    }
}

fn encode_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    counts: &BTreeMap<Labels, i64>,
) -> Result<(), std::fmt::Error> {
    let family = Family::<Labels, Gauge>::default();
    for (labels, n) in counts {
        family.get_or_create(labels).set(*n);
    }
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

impl Collector for StateGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = self.counts();
        if c.any_clusters {
            encode_family(
                &mut encoder,
                "clusters",
                "Clusters by state, mode and connection (AgentConnected, or ClusterConnected in push mode)",
                &c.clusters,
            )?;
            encode_family(&mut encoder, "bundles", "Bundles by state", &c.bundles)?;
            encode_family(
                &mut encoder,
                "bundle_conditions",
                "Bundles by condition (Ready, RolloutHalted, RolledBack, Polled), status and reason",
                &c.bundle_conditions,
            )?;
        }
        encode_family(
            &mut encoder,
            "bundle_deployments",
            "BundleDeployments by state (as their agent reports it)",
            &c.bundle_deployments,
        )?;
        encode_family(
            &mut encoder,
            "bundle_deployments_not_ready",
            "BundleDeployments whose Ready condition is not True, by reason (CopySignatureInvalid, ApplyFailed, ...)",
            &c.not_ready,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use prometheus_client::registry::Registry;
    use tender_types::bundle::{BundleDisplay, BundleStatus};
    use tender_types::bundle_deployment::{
        BundleDeploymentDisplay, BundleDeploymentSpec, BundleDeploymentStatus,
    };

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn store<K>(objects: Vec<K>) -> Store<K>
    where
        K: kube::Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let mut w = Writer::<K>::default();
        w.apply_watcher_event(&Event::Init);
        for o in objects {
            w.apply_watcher_event(&Event::InitApply(o));
        }
        w.apply_watcher_event(&Event::InitDone);
        w.as_reader()
    }

    fn named<K: kube::Resource>(mut o: K, name: &str) -> K {
        o.meta_mut().name = Some(name.into());
        o.meta_mut().namespace = Some("ws".into());
        o
    }

    fn bd(name: &str, state: &str, ready: Condition) -> BundleDeployment {
        let mut b = named(
            BundleDeployment::new(name, BundleDeploymentSpec::default()),
            name,
        );
        b.status = Some(BundleDeploymentStatus {
            conditions: vec![ready],
            display: Some(BundleDeploymentDisplay {
                state: state.into(),
            }),
            ..Default::default()
        });
        b
    }

    fn scrape(gauges: &StateGauges) -> String {
        let mut registry = Registry::default();
        registry
            .sub_registry_with_prefix("tender_hub")
            .register_collector(Box::new(gauges.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn scrapes_count_the_caches_and_stop_when_the_controllers_stop() {
        let gauges = StateGauges::default();
        let mut halted = named(Bundle::new("b", Default::default()), "b");
        halted.status = Some(BundleStatus {
            conditions: vec![cond("RolloutHalted", "True", "WaveFailed")],
            display: Some(BundleDisplay {
                state: "NotReady".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let clusters = store(vec![named(Cluster::new("c", Default::default()), "c")]);
        let bds = store(vec![
            bd("one", "Ready", cond("Ready", "True", "Ready")),
            bd(
                "two",
                "ErrApplied",
                cond("Ready", "False", "CopySignatureInvalid"),
            ),
        ]);
        let guard = gauges.attach(Some((clusters, store(vec![halted]))), bds.clone());
        let text = scrape(&gauges);
        for line in [
            "tender_hub_clusters{state=\"Unknown\",mode=\"Pull\",connected=\"Unknown\"} 1",
            "tender_hub_bundles{state=\"NotReady\"} 1",
            "tender_hub_bundle_conditions{type=\"RolloutHalted\",status=\"True\",reason=\"WaveFailed\"} 1",
            "tender_hub_bundle_deployments{state=\"ErrApplied\"} 1",
            "tender_hub_bundle_deployments{state=\"Ready\"} 1",
            "tender_hub_bundle_deployments_not_ready{reason=\"CopySignatureInvalid\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        // A shard replica's scope: no Cluster or Bundle counts, its BundleDeployments added.
        let shard = gauges.attach(None, bds);
        assert!(scrape(&gauges).contains("tender_hub_bundle_deployments{state=\"Ready\"} 2"));
        drop(shard);
        drop(guard);
        let idle = scrape(&gauges);
        assert!(!idle.contains("tender_hub_clusters{"), "{idle}");
        assert!(!idle.contains("tender_hub_bundle_deployments{"), "{idle}");
    }
}
