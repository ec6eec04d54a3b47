//! The chart-polling controller in-process (decision 0113-chart-polling-controller): what
//! `poll::reconcile` looks at and records, and how the Bundle reconcile follows it, asserted
//! on the requests the fake apiserver and a loopback chart repository received.
//!
//! The repository is a real HTTP server on 127.0.0.1, spawned on the test's own
//! (current-thread, paused-clock) runtime: whenever the runtime is idle, what the client sent
//! has already reached the server's socket, so tokio never auto-advances the paused clock past
//! the look's 30 s timeout while a request is in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tender_types::conditions::{self, TYPE_POLLED, reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::*;

/// The Bundle's interval (above the 15 s floor).
const INTERVAL: Duration = Duration::from_secs(60);

/// A chart repository on loopback serving `index.yaml` for chart `app`.
struct Repo {
    url: String,
    versions: Arc<Mutex<Vec<String>>>,
    looks: Arc<AtomicUsize>,
    server: JoinHandle<()>,
}

impl Repo {
    async fn start(versions: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/charts", listener.local_addr().expect("addr"));
        let versions = Arc::new(Mutex::new(
            versions.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        ));
        let looks = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (versions.clone(), looks.clone());
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (served, counted) = (served.clone(), counted.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let answer = if head.starts_with("GET /charts/index.yaml ") {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let index = index(&served.lock().expect("versions"));
                        format!(
                            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/yaml\r\nContent-Length: {}\r\n\r\n{index}",
                            index.len()
                        )
                    } else {
                        "HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
                            .to_string()
                    };
                    let _ = conn.write_all(answer.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self {
            url,
            versions,
            looks,
            server,
        }
    }

    /// Publishes `version` of the chart.
    fn publish(&self, version: &str) {
        self.versions
            .lock()
            .expect("versions")
            .push(version.to_string());
    }

    /// Index requests answered since the last call.
    fn take_looks(&self) -> usize {
        self.looks.swap(0, Ordering::SeqCst)
    }

    /// Stops listening: the next look is refused a connection.
    async fn gone(self) {
        self.server.abort();
        let _ = self.server.await;
    }
}

fn index(versions: &[String]) -> String {
    let mut out = String::from("apiVersion: v1\nentries:\n  app:\n");
    for v in versions {
        out.push_str(&format!(
            "  - name: app\n    version: {v}\n    urls: [app-{v}.tgz]\n"
        ));
    }
    out
}

/// Bundle `app`: chart `app` of `repo` in range `^0.1`, polled every [`INTERVAL`], to every
/// cluster labelled `env=prod`.
fn polling_spec(repo: &Repo, range: &str) -> Value {
    json!({
        "helm": {"chart": "app", "repo": repo.url, "version": range, "releaseName": "app"},
        "pollingInterval": "1m",
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
    })
}

/// A write of the hub as `verb resource ns/name by fieldManager`, events left out.
fn writes_by_manager(hub: &TestHub) -> Vec<String> {
    hub.fake
        .take_writes()
        .iter()
        .filter(|r| !r.path.ends_with("/events") && !r.path.contains("/events/"))
        .map(|r| {
            format!(
                "{} by {}",
                describe(r),
                r.param("fieldManager").unwrap_or_default()
            )
        })
        .collect()
}

fn poll_write() -> String {
    format!(
        "status bundles {WS}/app by {}",
        crate::poll::field_manager()
    )
}

fn sorted(mut writes: Vec<String>) -> Vec<String> {
    writes.sort();
    writes
}

fn cns(cluster: &str) -> String {
    names::cluster_namespace(WS, cluster)
}

/// The chart version `cluster`'s BundleDeployment of `app` is handed.
fn deployed_version(hub: &TestHub, cluster: &str) -> Option<String> {
    let bd: BundleDeployment = hub.get(Some(&cns(cluster)), "app")?;
    bd.spec.helm?.version
}

/// A `Polled` condition: status, reason, observedGeneration.
type Polled = (String, String, Option<i64>);

/// The Bundle's `status.version` and its `Polled` condition.
fn recorded(hub: &TestHub) -> (Option<String>, Option<Polled>) {
    let bundle: Bundle = hub.get(Some(WS), "app").expect("the Bundle");
    let status = bundle.status.unwrap_or_default();
    let polled = conditions::find_condition(&status.conditions, TYPE_POLLED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.observed_generation));
    (status.version, polled)
}

/// Every BundleDeployment's name and resourceVersion (moves with any change).
fn versions_of_deployments(hub: &TestHub) -> Vec<(Option<String>, Option<String>)> {
    hub.fake
        .all::<BundleDeployment>()
        .into_iter()
        .map(|bd| (bd.metadata.namespace, bd.metadata.resource_version))
        .collect()
}

/// Two prod clusters and Bundle `app` polling `repo`, looked at once and fanned out at the
/// version found (writes and looks taken).
async fn polled_and_fanned_out(repo: &Repo) -> TestHub {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.bundle("app", polling_spec(repo, "^0.1"));
    hub.reconcile_poll("app").await;
    hub.reconcile_bundle("app").await;
    hub.take_writes();
    repo.take_looks();
    hub
}

#[tokio::test(start_paused = true)]
async fn a_new_version_is_recorded_by_the_poller_and_then_deployed() {
    let repo = Repo::start(&["0.1.0", "0.2.0"]).await;
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.bundle("app", polling_spec(&repo, "^0.1"));
    hub.take_writes();

    // Never looked at: the Bundle reconcile waits for the poller (no range handed out).
    hub.reconcile_bundle("app").await;
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new());
    assert_eq!(repo.take_looks(), 0, "the Bundle reconcile never looks");

    // The poller looks once and records the version with its own field manager.
    let action = hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1);
    assert_eq!(writes_by_manager(&hub), [poll_write()]);
    assert_eq!(
        recorded(&hub),
        (
            Some("0.1.0".into()),
            Some(("True".into(), reason::VERSION_RESOLVED.into(), Some(1)))
        )
    );
    let next = format!("{action:?}");
    assert!(
        next.contains("requeue_after: Some(6"),
        "back on its interval: {next}"
    );

    // The Bundle reconcile hands every cluster the exact version.
    hub.reconcile_bundle("app").await;
    let manager = labels::HUB_FIELD_MANAGER;
    assert_eq!(
        sorted(writes_by_manager(&hub)),
        [
            format!("apply bundledeployments {}/app by {manager}", cns("one")),
            format!("apply bundledeployments {}/app by {manager}", cns("two")),
            format!("status bundles {WS}/app by {manager}"),
        ]
    );
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("0.1.0"));
    assert_eq!(deployed_version(&hub, "two").as_deref(), Some("0.1.0"));
    assert_eq!(
        recorded(&hub).0.as_deref(),
        Some("0.1.0"),
        "the Bundle's own status write leaves the poller's fields alone"
    );

    // A new version in the range: recorded at the next look, then deployed everywhere.
    repo.publish("0.1.1");
    tokio::time::advance(INTERVAL + Duration::from_secs(1)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1);
    assert_eq!(writes_by_manager(&hub), [poll_write()]);
    let stored: Bundle = hub.get(Some(WS), "app").expect("the Bundle");
    let polled = conditions::find_condition(
        &stored.status.as_ref().expect("status").conditions,
        TYPE_POLLED,
    )
    .expect("Polled");
    assert_eq!(polled.last_transition_time.0, hub.now(), "when it moved");
    assert!(polled.message.contains("0.1.1"), "{}", polled.message);
    hub.reconcile_bundle("app").await;
    let writes = writes_by_manager(&hub);
    assert_eq!(
        sorted(
            writes
                .into_iter()
                .filter(|w| w.contains("bundledeployments"))
                .collect()
        ),
        [
            format!("apply bundledeployments {}/app by {manager}", cns("one")),
            format!("apply bundledeployments {}/app by {manager}", cns("two")),
        ]
    );
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("0.1.1"));
    assert_eq!(deployed_version(&hub, "two").as_deref(), Some("0.1.1"));
}

#[tokio::test(start_paused = true)]
async fn looks_come_once_per_interval_and_write_nothing_when_nothing_is_new() {
    let repo = Repo::start(&["0.1.0"]).await;
    let hub = polled_and_fanned_out(&repo).await;

    // Within the interval: the look is not repeated, whatever wakes the poller.
    hub.reconcile_poll("app").await;
    tokio::time::advance(INTERVAL - Duration::from_secs(1)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 0, "no look before the interval");
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new());

    // After it: one look, which finds nothing new and writes nothing.
    tokio::time::advance(Duration::from_secs(2)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1, "one look after the interval");
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new(), "idle");
    hub.reconcile_bundle("app").await;
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new(), "idle");
    tokio::time::advance(INTERVAL * 10).await;
    hub.reconcile_poll("app").await;
    hub.reconcile_bundle("app").await;
    assert_eq!(repo.take_looks(), 1);
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new(), "idle");
}

#[tokio::test(start_paused = true)]
async fn a_repository_gone_keeps_the_recorded_version_and_changes_nothing_else() {
    let repo = Repo::start(&["0.1.0"]).await;
    let hub = polled_and_fanned_out(&repo).await;
    let bds_before = versions_of_deployments(&hub);
    repo.gone().await;

    tokio::time::advance(INTERVAL + Duration::from_secs(7)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(writes_by_manager(&hub), [poll_write()]);
    assert_eq!(
        recorded(&hub),
        (
            Some("0.1.0".into()),
            Some((
                "False".into(),
                reason::CHART_REPOSITORY_UNREACHABLE.into(),
                Some(1)
            ))
        ),
        "the version found before stays"
    );
    let bundle: Bundle = hub.get(Some(WS), "app").expect("the Bundle");
    let polled = conditions::find_condition(
        &bundle.status.as_ref().expect("status").conditions,
        TYPE_POLLED,
    )
    .expect("Polled");
    assert!(
        polled.message.ends_with("0.1.0 stays deployed"),
        "{}",
        polled.message
    );

    // Nothing else changes: no BundleDeployment written, none changed.
    hub.reconcile_bundle("app").await;
    let writes = writes_by_manager(&hub);
    assert!(
        !writes.iter().any(|w| !w.starts_with("status bundles")),
        "{writes:#?}"
    );
    assert_eq!(versions_of_deployments(&hub), bds_before);
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("0.1.0"));

    // Still gone at the next look: the same outcome, written once.
    tokio::time::advance(INTERVAL + Duration::from_secs(7)).await;
    hub.reconcile_poll("app").await;
    hub.reconcile_bundle("app").await;
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn the_bundle_waits_while_polled_is_for_an_older_generation() {
    let repo = Repo::start(&["0.1.0", "0.2.0"]).await;
    let hub = polled_and_fanned_out(&repo).await;

    // A new range: generation 2, Polled still says generation 1.
    hub.edit::<Bundle>(Some(WS), "app", |b| {
        b["spec"]["helm"]["version"] = "^0.2".into()
    });
    hub.take_writes();
    hub.reconcile_bundle("app").await;
    assert_eq!(
        writes_by_manager(&hub),
        Vec::<String>::new(),
        "the new range is not handed out unresolved"
    );
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("0.1.0"));

    // The poller looks at the new spec at once (its look cache is keyed by chart, not by
    // range, so the look of a minute ago answers) and the Bundle follows.
    hub.reconcile_poll("app").await;
    assert_eq!(writes_by_manager(&hub), [poll_write()]);
    assert_eq!(
        recorded(&hub),
        (
            Some("0.2.0".into()),
            Some(("True".into(), reason::VERSION_RESOLVED.into(), Some(2)))
        )
    );
    hub.reconcile_bundle("app").await;
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("0.2.0"));
    assert_eq!(deployed_version(&hub, "two").as_deref(), Some("0.2.0"));
}

/// The Bundle's `PollingInterval` condition: status, reason, message.
fn raised_condition(hub: &TestHub) -> Option<(String, String, String)> {
    let bundle: Bundle = hub.get(Some(WS), "app").expect("the Bundle");
    let status = bundle.status.unwrap_or_default();
    conditions::find_condition(&status.conditions, conditions::TYPE_POLLING_INTERVAL)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(start_paused = true)]
async fn an_interval_below_the_floor_is_raised_and_reported() {
    let repo = Repo::start(&["0.1.0"]).await;
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    let mut spec = polling_spec(&repo, "^0.1");
    spec["pollingInterval"] = json!("5s"); // Fleet's own tests use 5s
    hub.bundle("app", spec);
    hub.take_writes();

    let action = hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1);
    assert_eq!(
        writes_by_manager(&hub),
        [poll_write()],
        "one write, both conditions"
    );
    let next = format!("{action:?}");
    assert!(
        next.contains("requeue_after: Some(1"),
        "the floor, 15 s: {next}"
    );
    let (status, why, message) = raised_condition(&hub).expect("PollingInterval");
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", reason::POLLING_INTERVAL_RAISED)
    );
    assert_eq!(
        message,
        "pollingInterval 5s is below the hub's floor of 15s: the hub looks every 15s"
    );
    assert_eq!(recorded(&hub).0.as_deref(), Some("0.1.0"), "it polls");

    // Looks come at the floor's pace, not every 5 s.
    tokio::time::advance(Duration::from_secs(6)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 0, "5 s later: no look");
    tokio::time::advance(Duration::from_secs(10)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1, "16 s after the first: one look");
    assert_eq!(
        writes_by_manager(&hub),
        Vec::<String>::new(),
        "nothing new: idle"
    );

    // The Bundle controller's own status apply leaves the condition alone.
    hub.reconcile_bundle("app").await;
    assert!(raised_condition(&hub).is_some());

    // At or above the floor the condition goes.
    hub.edit::<Bundle>(Some(WS), "app", |b| {
        b["spec"]["pollingInterval"] = "15s".into()
    });
    hub.take_writes();
    hub.reconcile_poll("app").await;
    assert_eq!(writes_by_manager(&hub), [poll_write()]);
    assert_eq!(raised_condition(&hub), None);
}

#[tokio::test(start_paused = true)]
async fn zero_means_no_polling_as_in_fleet() {
    let repo = Repo::start(&["0.1.0"]).await;
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    let mut spec = polling_spec(&repo, "^0.1");
    spec["pollingInterval"] = json!("0");
    hub.bundle("app", spec);
    hub.take_writes();

    let action = hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 0, "never looked at");
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new());
    assert!(
        format!("{action:?}").contains("requeue_after: None"),
        "no interval: {action:?}"
    );
    assert_eq!(recorded(&hub), (None, None));
    assert_eq!(raised_condition(&hub), None);

    // The Bundle does not wait for a poller: the range goes out, as without pollingInterval.
    hub.reconcile_bundle("app").await;
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("^0.1"));
}

/// HelmOp `app`: chart `app` of `repo` in `range`, no pollingInterval, to the prod clusters.
fn helmop_without_polling(repo: &Repo, range: &str) -> Value {
    json!({
        "helm": {"chart": "app", "repo": repo.url, "version": range, "releaseName": "app"},
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
    })
}

#[tokio::test(start_paused = true)]
async fn a_helmops_range_without_polling_is_resolved_once_per_spec_as_in_fleet() {
    let repo = Repo::start(&["0.1.0"]).await;
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.helmop("app", helmop_without_polling(&repo, "^0.1"));
    hub.reconcile_helmop("app").await;
    hub.take_writes();

    // The Bundle waits for the one look, which records the version for this spec.
    hub.reconcile_bundle("app").await;
    hub.reconcile_bundle("app").await;
    assert_eq!(
        deployed_version(&hub, "one"),
        None,
        "not handed out unresolved"
    );
    hub.take_writes(); // the Bundle's finalizer and status
    let action = hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1);
    assert_eq!(writes_by_manager(&hub), [poll_write()]);
    assert!(
        format!("{action:?}").contains("requeue_after: None"),
        "{action:?}"
    );
    assert_eq!(
        recorded(&hub),
        (
            Some("0.1.0".into()),
            Some(("True".into(), reason::VERSION_RESOLVED.into(), Some(1)))
        )
    );
    assert_eq!(raised_condition(&hub), None);
    hub.reconcile_bundle("app").await;
    hub.reconcile_bundle("app").await;
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("0.1.0"));
    hub.take_writes();

    // A newer version in the range is not followed: no polling.
    repo.publish("0.1.1");
    tokio::time::advance(Duration::from_secs(3600)).await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 0, "resolved for this spec: no look");
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new());

    // A new spec is resolved again (Fleet: when the HelmOp's chart changes).
    hub.edit::<HelmOp>(Some(WS), "app", |h| {
        h["spec"]["helm"]["version"] = "~0.1".into()
    });
    hub.reconcile_helmop("app").await;
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 1);
    assert_eq!(recorded(&hub).0.as_deref(), Some("0.1.1"));
}

#[tokio::test(start_paused = true)]
async fn a_bundles_range_without_polling_is_left_to_the_agents_as_in_fleet() {
    let repo = Repo::start(&["0.1.0"]).await;
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    let mut spec = polling_spec(&repo, "^0.1");
    spec.as_object_mut()
        .expect("object")
        .remove("pollingInterval");
    hub.bundle("app", spec);
    hub.take_writes();
    hub.reconcile_poll("app").await;
    assert_eq!(repo.take_looks(), 0);
    assert_eq!(writes_by_manager(&hub), Vec::<String>::new());
    hub.reconcile_bundle("app").await;
    assert_eq!(deployed_version(&hub, "one").as_deref(), Some("^0.1"));
}
