//! The agent's deploy in-process on the paused clock: what it writes, and when.

use std::time::Duration;

use serde_json::{Value, json};
use tender_types::conditions::reason;
use tender_types::{ObjectState, ObjectStatus, labels};

use super::{Agent, TARGET, lines, writes_to};
use crate::helm::ChartFailure;

const COPY: &str = "app-secret-db-creds";
const SECRETS: &str = "/api/v1/namespaces/app/secrets";
const CONFIG_MAPS: &str = "/api/v1/namespaces/app/configmaps";

/// A Bundle's deployment: Secret `db-creds` copied, ConfigMap `app-settings` applied.
fn app_spec(id: &str) -> Value {
    json!({
        "deploymentID": id,
        "options": {
            "defaultNamespace": TARGET,
            "downstreamResources": [{"kind": "Secret", "name": "db-creds", "copyName": COPY}],
        },
        "resources": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-settings", "namespace": TARGET},
            "data": {"mode": "blue"},
        }],
    })
}

/// The status the agent reported for object `name` of BundleDeployment `bd`.
fn reported(agent: &Agent, bd: &str, name: &str) -> Option<ObjectStatus> {
    agent
        .bd(bd)
        .status?
        .resources
        .into_iter()
        .find(|r| r.name == name)
}

fn secret(agent: &Agent, name: &str) -> Option<Value> {
    agent.down.get("v1", "Secret", Some(TARGET), name)
}

fn config_map(agent: &Agent, name: &str) -> Option<Value> {
    agent.down.get("v1", "ConfigMap", Some(TARGET), name)
}

/// A Secret `db-creds` in the target namespace made by somebody else; `owner` is another
/// deployment's owner annotation (else it carries no tender metadata at all).
fn theirs(agent: &Agent, owner: Option<&str>) -> Value {
    agent
        .down
        .put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TARGET}}));
    let mut meta = json!({"name": "db-creds", "namespace": TARGET,
                          "labels": {"owner": "someone-else"}});
    if let Some(owner) = owner {
        meta["annotations"] = json!({ labels::OWNER_ANNOTATION: owner });
    }
    agent.down.put(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                          "data": {"password": "dGhlaXJz"}}),
    )
}

#[tokio::test(start_paused = true)]
async fn a_first_deploy_copies_the_secret_then_applies_and_reports() {
    let mut agent = Agent::new(|_| {}).await;
    agent.put_copy("app", "db-creds", COPY, &[("password", "s3cret")]);
    agent.put_bd("app", app_spec("d1"));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;

    let down = agent.down.requests();
    let writes = lines(
        &down
            .iter()
            .filter(|r| r.is_write())
            .cloned()
            .collect::<Vec<_>>(),
    );
    // The inventory first (nothing created is unknown after a crash), then the namespace,
    // the copy, and only then the manifest: copy before deploy.
    let at = |line: &str| {
        writes
            .iter()
            .position(|w| w.starts_with(line))
            .unwrap_or_else(|| panic!("no {line} in {writes:#?}"))
    };
    let inventory = at("PATCH /api/v1/namespaces/tender-system/configmaps/tender-inventory-");
    let namespace = at("POST /api/v1/namespaces");
    let copy = at(&format!("PATCH {SECRETS}/db-creds"));
    let manifest = at(&format!("PATCH {CONFIG_MAPS}/app-settings"));
    assert!(
        inventory < namespace && namespace < copy && copy < manifest,
        "{writes:#?}"
    );

    let copied = secret(&agent, "db-creds").expect("the copy downstream");
    assert_eq!(copied["data"]["password"], "czNjcmV0");
    assert_eq!(
        copied["metadata"]["annotations"][labels::OWNER_ANNOTATION],
        agent.owner("app")
    );
    assert_eq!(
        config_map(&agent, "app-settings").expect("applied")["data"]["mode"],
        "blue"
    );
    // Applied, and said so on the hub; the Secret's value is in no request to the hub.
    let status = agent.bd("app").status.expect("a status");
    assert!(status.applied_deployment_id.is_some(), "{status:?}");
    assert!(
        status
            .resources
            .iter()
            .all(|r| r.state == ObjectState::Ready),
        "{status:?}"
    );
    for r in agent.hub.requests() {
        let body = r.body.to_string();
        assert!(
            !body.contains("czNjcmV0") && !body.contains("s3cret"),
            "{}",
            r
        );
    }
}

#[tokio::test(start_paused = true)]
async fn idle_a_deployed_bundle_writes_nothing_again() {
    let mut agent = Agent::new(|_| {}).await;
    agent.put_copy("app", "db-creds", COPY, &[("password", "s3cret")]);
    agent.put_bd("app", app_spec("d1"));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    assert!(
        config_map(&agent, "app-settings").is_some(),
        "deployed first"
    );

    // Ten minutes of the agent's clock (its watches, its timers): nothing written anywhere.
    let (hub, down) = (agent.hub.mark(), agent.down.mark());
    agent.run_for(Duration::from_secs(600)).await;
    assert_eq!(lines(&agent.hub.writes_since(hub)), Vec::<String>::new());
    assert_eq!(lines(&agent.down.writes_since(down)), Vec::<String>::new());

    // And a deploy of the same BundleDeployment, once more, writes nothing either.
    let bd = agent.bd("app");
    crate::deploy::deploy(&bd, &agent.ctx)
        .await
        .expect("deploy");
    assert_eq!(lines(&agent.hub.writes_since(hub)), Vec::<String>::new());
    assert_eq!(lines(&agent.down.writes_since(down)), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_conflict_is_reported_and_looked_at_again_only_after_the_recheck() {
    let mut agent = Agent::new(|_| {}).await;
    let recheck = agent.ctx.config.conflict_recheck;
    let original = theirs(&agent, None);
    agent.put_copy("app", "db-creds", COPY, &[("password", "s3cret")]);
    agent.put_bd("app", app_spec("d1"));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;

    let conflict = reported(&agent, "app", "db-creds").expect("db-creds reported");
    assert_eq!(conflict.state, ObjectState::Conflict, "{conflict:?}");
    // Copy before deploy: the manifest is held back while the copy is not in place.
    assert!(config_map(&agent, "app-settings").is_none());
    assert!(writes_to(&agent.down.requests(), &format!("{SECRETS}/db-creds")).is_empty());

    // Until the re-check nothing is asked or written downstream; then their Secret is read
    // again (it may have gone), and still not written.
    let mark = agent.down.mark();
    agent.run_for(recheck - Duration::from_secs(2)).await;
    let reads_of_theirs = |from: usize| {
        agent
            .down
            .requests()
            .into_iter()
            .skip(from)
            .filter(|r| r.path == format!("{SECRETS}/db-creds"))
            .count()
    };
    assert_eq!(reads_of_theirs(mark), 0, "looked at before the re-check");
    assert_eq!(lines(&agent.down.writes_since(mark)), Vec::<String>::new());
    agent.run_for(Duration::from_secs(3)).await;
    assert_eq!(reads_of_theirs(mark), 1, "one look at the re-check");
    agent.run_for(recheck).await;
    assert_eq!(reads_of_theirs(mark), 2, "and one at the next");
    assert_eq!(lines(&agent.down.writes_since(mark)), Vec::<String>::new());
    assert_eq!(
        secret(&agent, "db-creds"),
        Some(original),
        "byte for byte theirs"
    );
    assert!(config_map(&agent, "app-settings").is_none());
}

#[tokio::test(start_paused = true)]
async fn an_object_whose_owner_let_go_is_adopted_at_the_recheck() {
    let mut agent = Agent::new(|_| {}).await;
    let recheck = agent.ctx.config.conflict_recheck;
    // Another cluster's deployment owns it (so its changes reach none of our watches).
    let original = theirs(&agent, Some("cluster-ws-west-0000/app"));
    agent.put_copy("app", "db-creds", COPY, &[("password", "s3cret")]);
    let mut spec = app_spec("d1");
    spec["options"]["takeOwnership"] = json!(true);
    agent.put_bd("app", spec);
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    let conflict = reported(&agent, "app", "db-creds").expect("reported");
    assert_eq!(
        conflict.state,
        ObjectState::Conflict,
        "another deployment's: never adopted"
    );
    // Not even with takeOwnership, across two re-checks.
    let mark = agent.down.mark();
    agent.run_for(recheck * 2 + Duration::from_secs(1)).await;
    assert_eq!(lines(&agent.down.writes_since(mark)), Vec::<String>::new());
    assert_eq!(secret(&agent, "db-creds"), Some(original.clone()));

    // Its owner goes with keepResources: tender's metadata stripped, the object left.
    let mut left = original.clone();
    left["metadata"]["annotations"] = json!({});
    agent.down.put(left);
    let mark = agent.down.mark();
    agent.run_for(recheck - Duration::from_secs(2)).await;
    assert_eq!(lines(&agent.down.writes_since(mark)), Vec::<String>::new());
    agent.run_for(Duration::from_secs(3)).await;

    let adopted = secret(&agent, "db-creds").expect("still there");
    assert_eq!(
        adopted["metadata"]["uid"], original["metadata"]["uid"],
        "the same object"
    );
    assert_eq!(
        adopted["metadata"]["annotations"][labels::OWNER_ANNOTATION],
        agent.owner("app")
    );
    assert_eq!(adopted["data"]["password"], "czNjcmV0");
    assert!(
        config_map(&agent, "app-settings").is_some(),
        "the manifest follows the copy"
    );
    assert_eq!(
        reported(&agent, "app", "db-creds").unwrap().state,
        ObjectState::Ready
    );
}

/// A chart `web` rendering one ConfigMap `web-settings` with `greeting`, and optionally a
/// `pre-install` hook Job `migrate`.
fn chart(greeting: &str, hook: bool) -> crate::hooks::RenderedChart {
    let mut text = format!(
        "---\n# Source: web/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-settings\n  namespace: {TARGET}\ndata:\n  greeting: {greeting}\n"
    );
    if hook {
        text.push_str(&format!(
            "---\n# Source: web/templates/migrate.yaml\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  namespace: {TARGET}\n  annotations:\n    helm.sh/hook: pre-install\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: m\n        image: busybox\n"
        ));
    }
    crate::helm::parse_rendered(&text).expect("a chart")
}

fn chart_spec(id: &str) -> Value {
    json!({
        "deploymentID": id,
        "options": {"defaultNamespace": TARGET},
        "helm": {"chart": "web", "repo": "https://charts.example.com", "version": id},
    })
}

#[tokio::test(start_paused = true)]
async fn a_chart_that_cannot_be_fetched_keeps_what_is_deployed_and_is_retried_on_the_timer() {
    let mut agent = Agent::new(|_| {}).await;
    let recheck = agent.ctx.config.conflict_recheck;
    agent.ctx.charts.prerender("web", Ok(chart("hi", false)));
    agent.put_bd("app", chart_spec("1.0.0"));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    assert_eq!(
        config_map(&agent, "web-settings").expect("deployed")["data"]["greeting"],
        "hi"
    );

    // The next version's chart cannot be fetched: reported, nothing pruned or changed.
    agent.ctx.charts.prerender(
        "web",
        Err(ChartFailure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            "connection refused",
        )),
    );
    let mark = agent.down.mark();
    agent.put_bd("app", chart_spec("2.0.0"));
    agent.run_for(Duration::from_secs(1)).await;
    let failed = agent.bd("app").status.expect("status");
    let entry = failed
        .resources
        .iter()
        .find(|r| r.kind == "HelmRelease")
        .expect("the chart's entry");
    assert_eq!(entry.state, ObjectState::Error);
    assert!(
        entry
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with(reason::CHART_REPOSITORY_UNREACHABLE),
        "{entry:?}"
    );
    let deletes: Vec<_> = agent
        .down
        .writes_since(mark)
        .into_iter()
        .filter(|r| r.method == http::Method::DELETE)
        .collect();
    assert!(deletes.is_empty(), "nothing pruned: {:?}", lines(&deletes));
    assert_eq!(
        config_map(&agent, "web-settings").unwrap()["data"]["greeting"],
        "hi"
    );

    // The repository answers again; no event says so: the chart retry finds out.
    agent.ctx.charts.prerender("web", Ok(chart("hello", false)));
    agent.run_for(recheck - Duration::from_secs(3)).await;
    assert_eq!(
        config_map(&agent, "web-settings").unwrap()["data"]["greeting"],
        "hi",
        "not before the retry"
    );
    agent.run_for(Duration::from_secs(3)).await;
    assert_eq!(
        config_map(&agent, "web-settings").unwrap()["data"]["greeting"],
        "hello"
    );
    assert_eq!(
        agent
            .bd("app")
            .status
            .unwrap()
            .applied_deployment_id
            .as_deref(),
        Some("2.0.0")
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_hook_halts_the_deploy() {
    let mut agent = Agent::new(|_| {}).await;
    let poll = agent.ctx.config.hook_poll;
    agent.ctx.charts.prerender("web", Ok(chart("hi", true)));
    agent.put_bd("app", chart_spec("1.0.0"));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;

    // The pre-install hook runs first; the chart's objects wait for it.
    let job = agent
        .down
        .get("batch/v1", "Job", Some(TARGET), "migrate")
        .expect("the hook's Job");
    assert!(config_map(&agent, "web-settings").is_none());

    // It fails (as the Job controller would say).
    let mut failed = job.clone();
    failed["status"] = json!({"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]});
    agent.down.put(failed);
    agent.run_for(poll + Duration::from_secs(1)).await;
    let hook = reported(&agent, "app", "migrate").expect("the hook reported");
    assert_eq!(hook.state, ObjectState::Error, "{hook:?}");

    // Halted: the later phase is never applied, the failed hook not started again, across
    // polls and re-checks.
    let mark = agent.down.mark();
    agent.run_for(agent.ctx.config.conflict_recheck * 3).await;
    let later = agent.down.writes_since(mark);
    assert!(
        writes_to(&later, &format!("{CONFIG_MAPS}/web-settings")).is_empty()
            && writes_to(&later, "/apis/batch/v1/namespaces/app/jobs").is_empty(),
        "{:?}",
        lines(&later)
    );
    assert!(config_map(&agent, "web-settings").is_none());
    assert!(
        agent
            .bd("app")
            .status
            .unwrap()
            .applied_deployment_id
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn takeownership_never_adopts_tenders_own_install_and_does_not_retry_the_refusal() {
    let mut agent = Agent::new(|_| {}).await;
    agent
        .down
        .put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TARGET}}));
    let install = agent
        .down
        .put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "tender-agent-settings", "namespace": TARGET,
                     "labels": {labels::APP_NAME: labels::AGENT_APP_NAME}},
        "data": {"role": "agent"}}));
    agent.put_bd(
        "app",
        json!({
            "deploymentID": "d1",
            "options": {"defaultNamespace": TARGET, "takeOwnership": true},
            "resources": [
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "tender-agent-settings", "namespace": TARGET},
                 "data": {"role": "stolen"}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "plain", "namespace": TARGET}, "data": {"a": "b"}},
            ],
        }),
    );
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    let refused = reported(&agent, "app", "tender-agent-settings").expect("reported");
    assert_eq!(refused.state, ObjectState::Error);
    assert!(
        refused
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with(reason::REFUSED_BY_POLICY),
        "{refused:?}"
    );
    assert_eq!(
        reported(&agent, "app", "plain").unwrap().state,
        ObjectState::Ready
    );

    // A refusal waits for a change, not a timer: across three re-checks nothing is asked
    // again or written, and tender's own object is as it was.
    let mark = agent.down.mark();
    agent.run_for(agent.ctx.config.conflict_recheck * 3).await;
    let since: Vec<String> = agent
        .down
        .requests()
        .iter()
        .skip(mark)
        .map(ToString::to_string)
        .collect();
    assert!(
        !since.iter().any(|r| r.ends_with("/tender-agent-settings")),
        "{since:?}"
    );
    assert_eq!(lines(&agent.down.writes_since(mark)), Vec::<String>::new());
    assert_eq!(config_map(&agent, "tender-agent-settings"), Some(install));
}

#[tokio::test(start_paused = true)]
async fn a_chart_object_somebody_else_has_is_a_conflict_left_alone_across_rechecks() {
    let mut agent = Agent::new(|_| {}).await;
    let recheck = agent.ctx.config.conflict_recheck;
    agent
        .down
        .put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TARGET}}));
    let theirs = agent
        .down
        .put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "web-settings", "namespace": TARGET},
        "data": {"owner": "someone-else"}}));
    agent.ctx.charts.prerender("web", Ok(chart("hi", false)));
    agent.put_bd("app", chart_spec("1.0.0"));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    let conflict = reported(&agent, "app", "web-settings").expect("reported");
    assert_eq!(conflict.state, ObjectState::Conflict, "{conflict:?}");

    let mark = agent.down.mark();
    agent.run_for(recheck * 2 + Duration::from_secs(1)).await;
    let looks = agent
        .down
        .requests()
        .iter()
        .skip(mark)
        .filter(|r| r.path == format!("{CONFIG_MAPS}/web-settings"))
        .count();
    assert_eq!(looks, 2, "one look per re-check");
    assert_eq!(lines(&agent.down.writes_since(mark)), Vec::<String>::new());
    assert_eq!(config_map(&agent, "web-settings"), Some(theirs));
}
