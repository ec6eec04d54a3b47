//! The Prometheus registry and the metric families every tender controller reports.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

/// Labels of the per-controller families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// Controller name, e.g. `bundle` or `deploy`.
    pub controller: String,
}

/// Labels of `reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Controller name.
    pub controller: String,
    /// Stable CamelCase reason, the same word used in conditions.
    pub reason: String,
}

/// Labels of `kube_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeRequestLabels {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// Resource plural from the URL path (`secrets`, `bundledeployments`); empty for discovery.
    pub resource: String,
    /// Subresource such as `status`; empty when the request is on the object itself.
    pub subresource: String,
}

/// Labels of `object_writes_total` and `object_writes_skipped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// What the executor did: apply, status, patch, delete, recreate.
    pub verb: String,
    /// Kind of the object written.
    pub kind: String,
}

/// Prometheus registry plus the families shared by hub and agent.
///
/// Build it, register binary-specific families through [`Metrics::registry_mut`], then wrap it
/// in an `Arc` and hand clones to controllers, the client and the server. Families are
/// internally reference-counted, so a binary keeps its own clone of anything it registers.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    kube_requests: Family<KubeRequestLabels, Counter>,
    kube_requests_in_flight: Family<KubeRequestLabels, Gauge>,
    object_writes: Family<WriteLabels, Counter>,
    object_writes_skipped: Family<WriteLabels, Counter>,
}

/// Buckets for reconcile durations: 5 ms to about 10 s, which spans a cache-only no-op
/// reconcile up to a fan-out writing to many cluster namespaces.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates a registry holding the common families, with no samples yet.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = Family::<ControllerLabels, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        let kube_requests = Family::<KubeRequestLabels, Counter>::default();
        let kube_requests_in_flight = Family::<KubeRequestLabels, Gauge>::default();
        let object_writes = Family::<WriteLabels, Counter>::default();
        let object_writes_skipped = Family::<WriteLabels, Counter>::default();

        // Counter names get `_total` appended by the encoder.
        registry.register("reconciles", "Reconciliations started", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciliations that returned an error, by reason",
            reconcile_errors.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time spent in one reconciliation",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        registry.register(
            "kube_requests",
            "Requests sent to the Kubernetes apiserver, by verb and resource",
            kube_requests.clone(),
        );
        registry.register(
            "kube_requests_in_flight",
            "Requests sent to the Kubernetes apiserver and not answered yet (watches apart), by verb and resource",
            kube_requests_in_flight.clone(),
        );
        registry.register(
            "tender_object_writes",
            "Writes the executor made, by verb (apply, status, patch, delete, recreate) and kind",
            object_writes.clone(),
        );
        registry.register(
            "tender_object_writes_skipped",
            "Writes the executor skipped because it had just made the same one",
            object_writes_skipped.clone(),
        );

        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            kube_requests,
            kube_requests_in_flight,
            object_writes,
            object_writes_skipped,
        }
    }

    /// The underlying registry, for binary-specific families (call before sharing in an `Arc`).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The underlying registry, read-only.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts a reconciliation of `controller` and returns a guard that records its duration
    /// when dropped, so every exit path (`?` included) is measured.
    pub fn reconcile(&self, controller: &str) -> ReconcileTimer {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer {
            histogram: self.reconcile_duration.get_or_create_owned(&labels),
            start: Instant::now(),
        }
    }

    /// Counts a failed reconciliation of `controller` with a stable CamelCase `reason`.
    pub fn reconcile_error(&self, controller: &str, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one apiserver request; called by the client layer in [`crate::client`].
    pub fn kube_request(&self, verb: &str, resource: &str, subresource: &str) {
        self.kube_requests
            .get_or_create(&KubeRequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                subresource: subresource.to_owned(),
            })
            .inc();
    }

    /// Marks one apiserver request as sent and not answered yet, until the returned guard is
    /// dropped (answered, failed or given up); called by the client layer in [`crate::client`].
    pub fn kube_request_in_flight(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
    ) -> InFlight {
        let gauge = self
            .kube_requests_in_flight
            .get_or_create(&KubeRequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                subresource: subresource.to_owned(),
            })
            .clone();
        gauge.inc();
        InFlight(gauge)
    }

    /// Current value of `kube_requests_total` for one label set (0 if never seen), for
    /// in-process tests; reading does not create a series.
    pub fn kube_requests(&self, verb: &str, resource: &str, subresource: &str) -> u64 {
        self.kube_requests
            .get(&KubeRequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                subresource: subresource.to_owned(),
            })
            .map_or(0, |counter| counter.get())
    }

    /// Counts one write the executor made.
    pub fn object_write(&self, verb: &str, kind: &str) {
        self.object_writes
            .get_or_create(&WriteLabels {
                verb: verb.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Counts one write the executor skipped (the memo said it was just made).
    pub fn object_write_skipped(&self, verb: &str, kind: &str) {
        self.object_writes_skipped
            .get_or_create(&WriteLabels {
                verb: verb.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Current value of `tender_object_writes_total` for `verb` and `kind` (0 if never seen).
    pub fn object_writes(&self, verb: &str, kind: &str) -> u64 {
        self.object_writes
            .get(&WriteLabels {
                verb: verb.to_owned(),
                kind: kind.to_owned(),
            })
            .map_or(0, |counter| counter.get())
    }

    /// Encodes every registered family in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an Err here would mean a broken label encoder.
        encode(&mut out, &self.registry).expect("encoding metrics into a String");
        out
    }
}

/// The series names of an OpenMetrics text (as [`Metrics::encode`] writes it, or a scrape),
/// each with the label names its samples carry: what a PromQL selector can name.
pub fn series_labels(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if let Some(inner) = line[name_end..]
            .strip_prefix('{')
            .and_then(|rest| rest.split_once('}'))
        {
            // Label values here are tender's own words (kinds, verbs, reasons): no `,` or `=`.
            for pair in inner.0.split(',').filter(|p| !p.is_empty()) {
                labels.insert(pair.split('=').next().unwrap_or_default().to_string());
            }
        }
    }
    out
}

/// The rows of the metrics table in `docs/monitoring.md` that name `binary` in their last
/// column: each metric with the labels the charts' rules and dashboards use.
pub fn documented_metrics(doc: &str, binary: &str) -> Vec<(String, Vec<String>)> {
    doc.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let [metric, labels, by] = cells[..] else {
                return None;
            };
            let metric = metric.strip_prefix('`')?.strip_suffix('`')?;
            by.split(", ").any(|b| b == binary).then(|| {
                let labels = labels
                    .split(", ")
                    .filter_map(|x| x.strip_prefix('`')?.strip_suffix('`'))
                    .map(str::to_string)
                    .collect();
                (metric.to_string(), labels)
            })
        })
        .collect()
}

/// Records the elapsed time of one reconciliation into `reconcile_duration_seconds` on drop.
#[must_use = "the duration is recorded when the timer is dropped; bind it to a variable"]
#[derive(Debug)]
pub struct ReconcileTimer {
    histogram: Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

/// One request counted in `kube_requests_in_flight` until dropped.
#[must_use = "the request counts as in flight until the guard is dropped"]
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_in_flight_until_its_guard_is_dropped() {
        let metrics = Metrics::new();
        let line = "kube_requests_in_flight{verb=\"patch\",resource=\"leases\",subresource=\"\"}";
        let first = metrics.kube_request_in_flight("patch", "leases", "");
        let second = metrics.kube_request_in_flight("patch", "leases", "");
        assert!(metrics.encode().contains(&format!("{line} 2")));
        drop(first);
        assert!(metrics.encode().contains(&format!("{line} 1")));
        drop(second);
        assert!(metrics.encode().contains(&format!("{line} 0")));
    }

    #[test]
    fn encoding_includes_common_families_and_samples() {
        let metrics = Metrics::new();
        {
            let _timer = metrics.reconcile("bundle");
        }
        metrics.reconcile_error("bundle", "SourceMissing");
        metrics.kube_request("patch", "secrets", "");

        let text = metrics.encode();
        assert!(
            text.contains("reconciles_total{controller=\"bundle\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "reconcile_errors_total{controller=\"bundle\",reason=\"SourceMissing\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE reconcile_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("reconcile_duration_seconds_count{controller=\"bundle\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kube_requests_total{verb=\"patch\",resource=\"secrets\",subresource=\"\"} 1"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(metrics.kube_requests("patch", "secrets", ""), 1);
    }

    #[test]
    fn binaries_can_register_their_own_families() {
        let mut metrics = Metrics::new();
        let written = Counter::<u64>::default();
        metrics
            .registry_mut()
            .register("copies_written", "Copies written", written.clone());
        written.inc_by(3);
        assert!(metrics.encode().contains("copies_written_total 3"));
    }
}
