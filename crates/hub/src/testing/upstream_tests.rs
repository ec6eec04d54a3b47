//! The reverse-sync controller in-process (decision 0114-reverse-sync-controller): what
//! `upstream::reconcile` writes for a Bundle with `upstreamResources` — placeholders and the
//! agent's access in the cluster namespaces, publications in the Bundle's namespace — and the
//! status lines the Bundle controller then writes, asserted on the recorded requests.

use base64::Engine;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde_json::json;
use tender_types::conditions::{self, TYPE_UPSTREAM_PUBLISHED, reason};
use tender_types::upstream::UpstreamState;

use super::*;

/// The downstream Secret every targeted cluster reports back.
const NAME: &str = "vpc";
const NAMESPACE: &str = "net";

fn cns(cluster: &str) -> String {
    names::cluster_namespace(WS, cluster)
}

fn placeholder() -> String {
    names::upstream_placeholder("app", "Secret", NAMESPACE, NAME)
}

fn published(cluster: &str) -> String {
    names::upstream_name("app", cluster, NAME)
}

fn role() -> String {
    names::upstream_role("app")
}

/// Bundle `app` on every `env=prod` cluster, reporting back Secret `net/vpc`.
fn upstream_spec() -> Value {
    json!({
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        "upstreamResources": [{"kind": "Secret", "name": NAME, "namespace": NAMESPACE}],
    })
}

fn sorted(mut writes: Vec<String>) -> Vec<String> {
    writes.sort();
    writes
}

/// The writes reverse sync makes in `cluster`'s namespace on its first run there.
fn access_and_placeholder(cluster: &str) -> [String; 3] {
    [
        format!("apply rolebindings {}/{}", cns(cluster), role()),
        format!("apply roles {}/{}", cns(cluster), role()),
        format!("apply secrets {}/{}", cns(cluster), placeholder()),
    ]
}

/// Two prod clusters with Bundle `app` fanned out to both (BundleDeployments written, writes
/// taken), with `config`.
async fn deployed(config: HubConfig) -> TestHub {
    let hub = TestHub::with_config(config);
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.bundle("app", upstream_spec());
    hub.reconcile_bundle("app").await;
    hub.take_writes();
    hub
}

/// [`deployed`], and reverse sync run once (placeholders and access written, writes taken).
async fn placed() -> TestHub {
    let hub = deployed(test_config()).await;
    hub.reconcile_upstream("app").await;
    hub.take_writes();
    hub.take_lines_changed();
    hub
}

/// The agent on `cluster` reports the downstream Secret: `data` (as text) and its `type` in
/// the placeholder, observed present.
fn agent_reports(hub: &TestHub, cluster: &str, data: &[(&str, &str)], secret_type: &str) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), b64.encode(v).into()))
        .collect();
    hub.edit::<Secret>(Some(&cns(cluster)), &placeholder(), |s| {
        s["data"] = Value::Object(data);
        s["metadata"]["annotations"][labels::UPSTREAM_OBSERVED] = "Present".into();
        s["metadata"]["annotations"][labels::UPSTREAM_TYPE] = secret_type.into();
    });
}

/// The published Secret of `cluster`, its `peering` value as text.
fn published_peering(hub: &TestHub, cluster: &str) -> Option<String> {
    let s: Secret = hub.get(Some(WS), &published(cluster))?;
    let v = s.data?.get("peering")?.0.clone();
    Some(String::from_utf8(v).expect("text"))
}

/// Bundle `app`'s status lines as stored: (cluster, state).
fn lines(hub: &TestHub) -> Vec<(String, UpstreamState)> {
    let bundle: Bundle = hub.get(Some(WS), "app").expect("the Bundle");
    bundle
        .status
        .unwrap_or_default()
        .upstream
        .into_iter()
        .map(|l| (l.cluster, l.state))
        .collect()
}

/// The requests since the last call: how many reads of one Secret (the placeholders: the
/// controller reads nothing else one by one), and the writes as [`TestHub::take_writes`]
/// describes them.
fn reads_and_writes(hub: &TestHub) -> (usize, Vec<String>) {
    let requests = hub.fake.take_requests();
    let reads = requests
        .iter()
        .filter(|r| r.method == http::Method::GET && r.path.contains("/secrets/"))
        .count();
    let writes = requests
        .iter()
        .filter(|r| r.is_write() && !r.path.ends_with("/events"))
        .map(describe)
        .collect();
    (reads, writes)
}

#[tokio::test(start_paused = true)]
async fn placeholders_and_the_agents_access_are_written_where_a_deployment_is() {
    let hub = deployed(test_config()).await;

    hub.reconcile_upstream("app").await;
    let writes = hub.take_writes();
    let mut expected: Vec<String> = access_and_placeholder("one").into();
    expected.extend(access_and_placeholder("two"));
    assert_eq!(sorted(writes), sorted(expected));
    assert_eq!(hub.take_lines_changed(), ["app"], "its lines are new");

    // The placeholder: empty, labelled for this Bundle and cluster, owned by the
    // BundleDeployment (it goes with it).
    let bd: BundleDeployment = hub.get(Some(&cns("one")), "app").expect("deployment");
    let p: Secret = hub
        .get(Some(&cns("one")), &placeholder())
        .expect("placeholder");
    assert!(p.data.unwrap_or_default().is_empty());
    let l = p.metadata.labels.expect("labels");
    assert_eq!(l[labels::UPSTREAM], labels::UPSTREAM_PLACEHOLDER);
    assert_eq!(l[labels::CLUSTER], "one");
    assert_eq!(
        p.metadata.owner_references.expect("owned")[0].uid,
        bd.metadata.uid.expect("uid")
    );
    // The agent may write exactly that placeholder, and nothing else.
    let r: Role = hub.get(Some(&cns("one")), &role()).expect("Role");
    let rules = r.rules.expect("rules");
    assert!(
        rules.iter().all(|rule| {
            rule.resource_names.as_deref() == Some(std::slice::from_ref(&placeholder()))
                && !rule.verbs.iter().any(|v| v == "create" || v == "delete")
        }),
        "{rules:#?}"
    );
    let b: RoleBinding = hub.get(Some(&cns("one")), &role()).expect("RoleBinding");
    assert_eq!(b.role_ref.name, role());

    // The Bundle controller writes the lines: both pending until an agent reports.
    hub.reconcile_bundle("app").await;
    assert_eq!(
        lines(&hub),
        [
            ("one".to_string(), UpstreamState::Pending),
            ("two".to_string(), UpstreamState::Pending)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_reported_placeholder_is_published_with_its_verdict_and_then_left_alone() {
    let hub = placed().await;
    agent_reports(&hub, "one", &[("peering", "pcx-1")], "Opaque");
    hub.fake.take_requests();

    hub.reconcile_upstream("app").await;
    assert_eq!(
        reads_and_writes(&hub),
        (1, vec![format!("apply secrets {WS}/{}", published("one"))]),
        "read once (its version moved) and published"
    );
    assert_eq!(published_peering(&hub, "one").as_deref(), Some("pcx-1"));
    let s: Secret = hub.get(Some(WS), &published("one")).expect("published");
    let l = s.metadata.labels.expect("labels");
    assert_eq!(l[labels::UPSTREAM], labels::UPSTREAM_PUBLISHED);
    assert_eq!(l[labels::CLUSTER], "one");
    let bundle: Bundle = hub.get(Some(WS), "app").expect("Bundle");
    assert_eq!(
        s.metadata.owner_references.expect("owned")[0].uid,
        bundle.metadata.uid.expect("uid"),
        "owned by the Bundle"
    );
    assert!(hub.get::<Secret>(Some(WS), &published("two")).is_none());

    // The verdict reaches status through the Bundle controller, which it woke.
    assert_eq!(hub.take_lines_changed(), ["app"]);
    hub.reconcile_bundle("app").await;
    assert_eq!(hub.take_writes(), [format!("status bundles {WS}/app")]);
    assert_eq!(
        lines(&hub),
        [
            ("one".to_string(), UpstreamState::Published),
            ("two".to_string(), UpstreamState::Pending)
        ]
    );

    // Idle: nothing read again, nothing written, nobody woken.
    hub.fake.take_requests();
    hub.reconcile_upstream("app").await;
    hub.reconcile_bundle("app").await;
    assert_eq!(
        reads_and_writes(&hub),
        (0, vec![]),
        "the verdict is remembered: nothing read, nothing written"
    );
    assert_eq!(hub.take_lines_changed(), Vec::<String>::new());
    tokio::time::advance(std::time::Duration::from_secs(3600)).await;
    hub.reconcile_upstream("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());

    // A new value downstream: published again, once.
    agent_reports(&hub, "one", &[("peering", "pcx-2")], "Opaque");
    hub.reconcile_upstream("app").await;
    assert_eq!(
        hub.take_writes(),
        [format!("apply secrets {WS}/{}", published("one"))]
    );
    assert_eq!(published_peering(&hub, "one").as_deref(), Some("pcx-2"));
}

#[tokio::test(start_paused = true)]
async fn untargeting_removes_the_publication_once_the_deployment_is_going() {
    let hub = placed().await;
    agent_reports(&hub, "one", &[("peering", "pcx-1")], "Opaque");
    agent_reports(&hub, "two", &[("peering", "pcx-2")], "Opaque");
    hub.reconcile_upstream("app").await;
    hub.take_writes();
    hub.take_lines_changed();

    // Cluster one untargeted; its BundleDeployment still there: reverse sync follows
    // deployments, not targeting, and keeps publishing.
    hub.edit::<Cluster>(Some(WS), "one", |c| {
        c["metadata"]["labels"]["env"] = "staging".into()
    });
    hub.reconcile_upstream("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
    assert_eq!(published_peering(&hub, "one").as_deref(), Some("pcx-1"));

    // The Bundle controller deletes the deployment (the agent's finalizer holds it).
    hub.reconcile_bundle("app").await;
    hub.take_writes();
    hub.reconcile_upstream("app").await;
    assert_eq!(
        hub.take_writes(),
        [format!("delete secrets {WS}/{}", published("one"))],
        "its placeholder and access go with the deployment (owner references)"
    );
    assert!(hub.get::<Secret>(Some(WS), &published("one")).is_none());
    assert_eq!(published_peering(&hub, "two").as_deref(), Some("pcx-2"));
    assert_eq!(hub.take_lines_changed(), ["app"]);

    // Gone for good once the agent let go: nothing more to do.
    let bd = ApiResource::erase::<BundleDeployment>(&());
    assert!(hub.fake.remove(&bd, Some(&cns("one")), "app"));
    hub.sync();
    hub.reconcile_upstream("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new());
    hub.reconcile_bundle("app").await;
    assert_eq!(lines(&hub), [("two".to_string(), UpstreamState::Published)]);
}

#[tokio::test(start_paused = true)]
async fn content_over_the_limit_or_of_a_refused_type_is_not_published() {
    let hub = deployed(HubConfig {
        upstream_max_bytes: 32,
        ..test_config()
    })
    .await;
    hub.reconcile_upstream("app").await;
    hub.take_writes();

    // One: a first publication within the limit, then content over it.
    agent_reports(&hub, "one", &[("peering", "pcx-1")], "Opaque");
    hub.reconcile_upstream("app").await;
    hub.take_writes();
    agent_reports(&hub, "one", &[("peering", &"x".repeat(64))], "Opaque");
    // Two: a Secret type the hub never publishes.
    agent_reports(
        &hub,
        "two",
        &[("token", "t")],
        "kubernetes.io/service-account-token",
    );
    hub.reconcile_upstream("app").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new(), "nothing published");
    assert_eq!(
        published_peering(&hub, "one").as_deref(),
        Some("pcx-1"),
        "the last publication is kept"
    );
    assert!(hub.get::<Secret>(Some(WS), &published("two")).is_none());

    hub.reconcile_bundle("app").await;
    assert_eq!(
        lines(&hub),
        [
            ("one".to_string(), UpstreamState::Rejected),
            ("two".to_string(), UpstreamState::Rejected)
        ]
    );
    let bundle: Bundle = hub.get(Some(WS), "app").expect("Bundle");
    let status = bundle.status.expect("status");
    let c = conditions::find_condition(&status.conditions, TYPE_UPSTREAM_PUBLISHED)
        .expect("UpstreamPublished");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::UPSTREAM_REJECTED)
    );
    let why: Vec<String> = status
        .upstream
        .iter()
        .map(|l| l.message.clone().unwrap_or_default())
        .collect();
    assert!(why[0].contains("more than the 32 bytes"), "{why:?}");
    assert!(
        why[1].contains("kubernetes.io/service-account-token"),
        "{why:?}"
    );
    assert!(
        !why.iter().any(|m| m.contains("xxxx") || m.contains(": t")),
        "no content quoted: {why:?}"
    );

    // Refused once: not read and judged again while it does not move, and nothing written.
    hub.fake.take_requests();
    hub.reconcile_upstream("app").await;
    hub.reconcile_bundle("app").await;
    assert_eq!(reads_and_writes(&hub), (0, vec![]));
}
