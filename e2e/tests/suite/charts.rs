//! The Helm charts render, lint, and every object they produce is accepted by a real
//! apiserver (server-side dry run, so schemas, RBAC and admission all apply).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use tender_e2e::{
    HUB, crds::install_crds, downstream_name, ensure_helm, shared_env_of, unique_name,
};

fn chart(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/charts")
        .join(name)
}

fn helm(args: &[&str]) -> std::process::Output {
    let helm = ensure_helm().expect("building helm");
    Command::new(helm)
        .args(args)
        .output()
        .expect("running helm")
}

fn template(chart_name: &str, namespace: &str, set: &[&str]) -> Vec<DynamicObject> {
    let path = chart(chart_name);
    let mut args = vec!["template", "t", path.to_str().unwrap(), "-n", namespace];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = helm(&args);
    assert!(
        out.status.success(),
        "helm template {chart_name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple::<Option<DynamicObject>>(&text)
        .expect("helm output parses")
        .into_iter()
        .flatten()
        .collect()
}

async fn dry_run_apply(client: &kube::Client, namespace: &str, objects: &[DynamicObject]) {
    create_namespace(client, namespace).await;
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    dry_run(client, &discovery, namespace, objects).await;
}

async fn create_namespace(client: &kube::Client, namespace: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

/// Server-side dry run of `objects` (namespaced ones in `namespace` unless they say).
async fn dry_run(
    client: &kube::Client,
    discovery: &Discovery,
    namespace: &str,
    objects: &[DynamicObject],
) {
    let mut pp = PatchParams::apply("tender-e2e").force();
    pp.dry_run = true;
    for obj in objects {
        let types = obj.types.as_ref().unwrap();
        let gvk = kube::api::GroupVersionKind::try_from(types).unwrap();
        let (ar, caps): (ApiResource, _) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("{} {} is not served", types.api_version, types.kind));
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or(namespace),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let name = obj.metadata.name.clone().unwrap();
        if let Err(e) = api.patch(&name, &pp, &Patch::Apply(obj)).await {
            panic!("{} {name} rejected by the apiserver: {e}", types.kind);
        }
    }
}

#[test]
fn charts_lint_clean() {
    for (name, set) in [
        ("tender-hub", vec![]),
        (
            "tender-agent",
            vec!["--set", "clusterName=east", "--set", "hubKubeconfig=x"],
        ),
    ] {
        let path = chart(name);
        let mut args = vec!["lint", "--strict", path.to_str().unwrap()];
        args.extend(set);
        let out = helm(&args);
        assert!(
            out.status.success(),
            "helm lint {name}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn agent_chart_refuses_missing_values_with_a_clear_message() {
    let path = chart("tender-agent");
    let out = helm(&["template", "t", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("clusterName is required"));
    let out = helm(&[
        "template",
        "t",
        path.to_str().unwrap(),
        "--set",
        "clusterName=east",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hubKubeconfig"));
}

#[tokio::test]
async fn hub_chart_objects_are_accepted_by_the_hub_apiserver() {
    let env = shared_env_of("charts", 1).await;
    let client = env.client(HUB).await.unwrap();
    // The chart's crds/ directory is what `helm install` applies first.
    install_crds(&client).await.unwrap();
    let ns = unique_name("tender-system");
    let objects = template(
        "tender-hub",
        &ns,
        &["workspaceNamespaces={tender-default}", "shards[0].id=eu"],
    );
    let kinds: Vec<_> = objects
        .iter()
        .map(|o| o.types.as_ref().unwrap().kind.as_str())
        .collect();
    for want in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
    ] {
        assert!(kinds.contains(&want), "hub chart lacks a {want}: {kinds:?}");
    }
    let deployment = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .unwrap();
    let env_vars = deployment.data["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env_vars.contains("EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM"));
    // `shards`: one more Deployment per shard id (decision 0062-hub-shards).
    let deployments: Vec<_> = objects
        .iter()
        .filter(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .map(|o| o.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(deployments, ["tender-hub", "tender-hub-shard-eu"]);
    dry_run_apply(&client, &ns, &objects).await;
}

#[tokio::test]
async fn agent_chart_objects_are_accepted_by_a_downstream_apiserver() {
    let env = shared_env_of("charts", 1).await;
    let client = env.client(&downstream_name(1)).await.unwrap();
    let ns = unique_name("tender-system");
    let objects = template(
        "tender-agent",
        &ns,
        &[
            "clusterName=east",
            "hubKubeconfig=apiVersion: v1",
            "chartCache.sizeLimit=64Mi",
        ],
    );
    let kinds: Vec<_> = objects
        .iter()
        .map(|o| o.types.as_ref().unwrap().kind.as_str())
        .collect();
    assert!(kinds.contains(&"Secret") && kinds.contains(&"Deployment"));
    // chartCache.sizeLimit: the chart cache's emptyDir (a kubelet limit, not a flag).
    let deployment = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .unwrap();
    let volumes = deployment.data["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains(r#"{"emptyDir":{"sizeLimit":"64Mi"},"name":"chart-cache"}"#),
        "{volumes}"
    );
    dry_run_apply(&client, &ns, &objects).await;
}

/// Whether `rule` of a ClusterRole covers `(group, resource, verb, name)`, RBAC's way:
/// `resourceNames` empty means every name.
fn covers(
    rule: &serde_json::Value,
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let has = |field: &str, want: &str| {
        rule[field]
            .as_array()
            .is_some_and(|xs| xs.iter().any(|x| x == want || x == "*"))
    };
    let names_ok = match rule["resourceNames"].as_array() {
        None => true,
        Some(names) if names.is_empty() => true,
        Some(names) => name.is_some_and(|n| names.iter().any(|x| x == n)),
    };
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb) && names_ok
}

/// The hub creates the agents' Roles without `escalate` or `bind`, so its ClusterRole must
/// hold every permission in them (the apiserver would refuse the Role otherwise), and nothing
/// lets it write arbitrary RBAC.
#[test]
fn hub_chart_rbac_has_no_escalate_or_bind_and_holds_every_agent_permission() {
    let objects = template("tender-hub", "tender-system", &[]);
    let role = objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "ClusterRole")
        .expect("a ClusterRole");
    let rules = role.data["rules"].as_array().unwrap();
    for rule in rules {
        for verb in rule["verbs"].as_array().unwrap() {
            assert!(
                !["escalate", "bind", "impersonate", "*"].contains(&verb.as_str().unwrap()),
                "the hub must not hold {verb}: {rule}"
            );
        }
    }
    let access = tender_hub::cluster::agent_access("ws", "east");
    let (upstream, _) = tender_hub::cluster::upstream_access(
        "ns",
        "app",
        &["s".into()],
        &["c".into()],
        &Default::default(),
    )
    .unwrap();
    for agent_rule in [access.role, access.workspace_role, upstream]
        .into_iter()
        .flat_map(|r| r.rules.unwrap_or_default())
    {
        let names: Vec<Option<&str>> = match agent_rule.resource_names.as_deref() {
            Some(ns) if !ns.is_empty() => ns.iter().map(|n| Some(n.as_str())).collect(),
            _ => vec![None],
        };
        for group in agent_rule.api_groups.iter().flatten() {
            for resource in agent_rule.resources.iter().flatten() {
                for verb in &agent_rule.verbs {
                    for name in &names {
                        assert!(
                            rules
                                .iter()
                                .any(|r| covers(r, group, resource, verb, *name)),
                            "the hub's ClusterRole lacks {verb} {group}/{resource} {name:?}, which it grants agents"
                        );
                    }
                }
            }
        }
    }
}

/// The shipped agent chart runs a Helm Bundle under its pod's securityContext: the real
/// `tender-agent` from the chart's rendered Deployment, under bubblewrap with a read-only root,
/// the non-root uid and only the chart's volumes ([`tender_e2e::local_pod`]), fetches, caches
/// and renders a chart from the loopback repository. The chart cache must be one of those
/// volumes (`/tmp` is read-only there).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_chart_renders_a_helm_bundle_under_its_pods_security_context() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;
    use tender_e2e::charts::ChartRepo;
    use tender_e2e::fixture::Workspace;
    use tender_e2e::running::{AgentOpts, start_agent};

    let env = shared_env_of("charts", 1).await;
    let repo = ChartRepo::start(&["0.1.0"], "reader", "repo-pass-456")
        .await
        .expect("starting the chart repository");
    let ws = Workspace::new(env, "chart-sandbox").await;
    ws.cluster("east").await;
    let helm = ensure_helm().expect("building helm");
    let release_ns = unique_name("tender-system");
    let agent = start_agent(
        &ws,
        "east",
        &downstream_name(1),
        AgentOpts {
            release_ns: Some(&release_ns),
            flags: &[("--helm-path", helm.to_str().unwrap())],
            // The Bundle lands in a namespace of its own, which the chart's default Bundle
            // ServiceAccount may not create (least_privilege.rs): the pod's sandbox is the
            // subject here, not RBAC.
            sets: &["bundleServiceAccount.clusterAdmin=true"],
            ..Default::default()
        },
    )
    .await;
    ws.source_secret(
        "repo-auth",
        &[("username", "reader"), ("password", "repo-pass-456")],
    )
    .await;
    let app_ns = unique_name("chart-sandbox-app");
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": app_ns,
            "downstreamResources": [{"kind": "Secret", "name": "repo-auth"}],
            "helm": {"chart": "app", "repo": repo.url, "version": "0.1.0",
                     "releaseName": "web", "helmSecretName": "repo-auth",
                     "values": {"greeting": "sandboxed"}},
        }),
    )
    .await;
    // Ready, or the Deployed message that says why not.
    let bds = ws.bds("east");
    let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let ready = tender_e2e::within(tender_e2e::fixture::WAIT, || {
        let (bds, last) = (bds.clone(), last.clone());
        async move {
            let Ok(bd) = bds.get("app").await else {
                return false;
            };
            let status = bd.status.unwrap_or_default();
            *last.lock().unwrap() = serde_json::to_string(&status.conditions).unwrap_or_default();
            status.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                && tender_types::conditions::is_true(&status.conditions, "Ready")
        }
    })
    .await;
    assert!(
        ready,
        "the Helm Bundle is not Ready: {}",
        last.lock().unwrap()
    );
    let down = env.client(&downstream_name(1)).await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(down, &app_ns)
        .get("web-config")
        .await
        .unwrap();
    assert_eq!(
        cm.data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some("sandboxed")
    );
    // issue 40: the running agent exports what docs/monitoring.md lists for it.
    assert_exports_listed_metrics(&agent.scrape().await, "agent");
}

/// Each chart's opt-in toggles (docs/monitoring.md), as `--set` arguments; the NetworkPolicy's
/// with the CIDRs it requires.
fn toggles(chart_name: &str) -> Vec<&'static str> {
    let mut t = vec![
        "metrics.serviceMonitor.enabled=true",
        "metrics.podMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
    ];
    if chart_name == "tender-hub" {
        t.push("podDisruptionBudget.enabled=true");
        t.push(
            "networkPolicy.enabled=true,networkPolicy.apiServer.cidrs={10.0.0.1/32},\
             networkPolicy.chartHosts.cidrs={0.0.0.0/0},\
             networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
        );
    } else {
        t.push(
            "networkPolicy.enabled=true,networkPolicy.apiServer.cidrs={10.0.0.1/32},\
             networkPolicy.hubApiServer.cidrs={10.1.0.0/24},networkPolicy.chartHosts.cidrs={0.0.0.0/0}",
        );
    }
    t
}

/// The values every render of `chart_name` needs (the hub with a shard and two replicas, so
/// the per-shard Service and the disruption budgets render).
fn base_values(chart_name: &str) -> Vec<&'static str> {
    if chart_name == "tender-hub" {
        vec!["workspaceNamespaces={tender-default}", "shards[0].id=eu"]
    } else {
        vec!["clusterName=east", "hubKubeconfig=apiVersion: v1"]
    }
}

fn kind_of(o: &DynamicObject) -> &str {
    o.types.as_ref().map_or("", |t| t.kind.as_str())
}

/// Renders `chart_name` with every combination of its toggles and dry-runs each on the
/// apiserver `client` serves, the prometheus-operator CRDs installed first.
async fn every_combination_is_accepted(client: kube::Client, chart_name: &str) {
    tender_e2e::prometheus_operator::install_crds(&client)
        .await
        .expect("installing the prometheus-operator CRDs");
    let ns = unique_name("tender-toggles");
    create_namespace(&client, &ns).await;
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let toggles = toggles(chart_name);
    let mut seen = std::collections::BTreeSet::new();
    for mask in 0..(1u32 << toggles.len()) {
        let mut set = base_values(chart_name);
        set.extend(
            toggles
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, t)| *t),
        );
        let objects = template(chart_name, &ns, &set);
        seen.extend(objects.iter().map(|o| kind_of(o).to_string()));
        dry_run(&client, &discovery, &ns, &objects).await;
    }
    for kind in [
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "ConfigMap",
    ] {
        assert!(seen.contains(kind), "{chart_name} never rendered a {kind}");
    }
}

/// issue 40: the hub chart's toggles, every combination (64), accepted by the hub apiserver.
#[tokio::test]
async fn every_combination_of_the_hub_charts_toggles_is_accepted() {
    let env = shared_env_of("charts", 1).await;
    let client = env.client(HUB).await.unwrap();
    install_crds(&client).await.unwrap();
    every_combination_is_accepted(client, "tender-hub").await;
}

/// issue 40: the agent chart's toggles, every combination (32), accepted downstream.
#[tokio::test]
async fn every_combination_of_the_agent_charts_toggles_is_accepted() {
    let env = shared_env_of("charts", 1).await;
    let client = env.client(&downstream_name(1)).await.unwrap();
    every_combination_is_accepted(client, "tender-agent").await;
}

#[test]
fn charts_lint_clean_with_every_toggle_on() {
    for name in ["tender-hub", "tender-agent"] {
        let path = chart(name);
        let mut args = vec!["lint", "--strict", path.to_str().unwrap()];
        for s in base_values(name).into_iter().chain(toggles(name)) {
            args.extend(["--set", s]);
        }
        let out = helm(&args);
        assert!(
            out.status.success(),
            "helm lint {name} with every toggle:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The disruption budgets follow the replicas (one per Deployment, none for a single
/// replica), and a NetworkPolicy without the apiserver's address is refused by name.
#[test]
fn hub_chart_budgets_follow_replicas_and_policies_need_the_apiserver() {
    let budgets = |replicas: &str| {
        let r = format!("replicaCount={replicas}");
        template(
            "tender-hub",
            "tender-system",
            &["shards[0].id=eu", "podDisruptionBudget.enabled=true", &r],
        )
        .into_iter()
        .filter(|o| kind_of(o) == "PodDisruptionBudget")
        .map(|o| o.metadata.name.unwrap())
        .collect::<Vec<_>>()
    };
    assert_eq!(budgets("2"), ["tender-hub", "tender-hub-shard-eu"]);
    assert!(budgets("1").is_empty());
    for (name, set, want) in [
        (
            "tender-hub",
            vec!["networkPolicy.enabled=true"],
            "networkPolicy.apiServer.cidrs is required",
        ),
        (
            "tender-agent",
            vec![
                "clusterName=east",
                "hubKubeconfig=x",
                "networkPolicy.enabled=true",
                "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
            ],
            "networkPolicy.hubApiServer.cidrs is required",
        ),
    ] {
        let path = chart(name);
        let mut args = vec!["template", "t", path.to_str().unwrap()];
        for s in &set {
            args.extend(["--set", s]);
        }
        let out = helm(&args);
        assert!(!out.status.success(), "{name} {set:?} rendered");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{name}: {err}");
    }
}

/// The metric and label names a PromQL expression reads: a small reader for the charts' own
/// expressions (strings, durations, numbers, functions and keywords skipped; names inside
/// `{}` and after `by`/`without`/`on`/`ignoring` are labels).
fn promql_names(
    expr: &str,
) -> (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<String>,
) {
    // Operators, and aggregations (which may be followed by `by (…)` before their `(`).
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let (mut metrics, mut labels) = (Default::default(), std::collections::BTreeSet::new());
    let metrics: &mut std::collections::BTreeSet<String> = &mut metrics;
    let b = expr.as_bytes();
    let (mut i, mut in_braces, mut in_list, mut list_next) = (0, false, false, false);
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == b'[' {
            while i < b.len() && b[i] != b']' {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            let called = expr[i..].trim_start().starts_with('(');
            if in_braces || in_list {
                labels.insert(word.to_string());
            } else if LABEL_LISTS.contains(&word) {
                list_next = true;
            } else if !KEYWORDS.contains(&word) && !called {
                metrics.insert(word.to_string());
            }
        } else {
            match c {
                b'{' => in_braces = true,
                b'}' => in_braces = false,
                b'(' if list_next => (in_list, list_next) = (true, false),
                b')' => in_list = false,
                _ => {}
            }
            i += 1;
        }
    }
    (std::mem::take(metrics), labels)
}

#[test]
fn promql_names_reads_metrics_and_labels() {
    let (m, l) = promql_names(
        r#"histogram_quantile(0.99, sum by (controller, le) (rate(x_bucket{namespace="a", c!~"b{"}[10m]))) > 5 unless y == 1"#,
    );
    assert_eq!(m.into_iter().collect::<Vec<_>>(), ["x_bucket", "y"]);
    assert_eq!(
        l.into_iter().collect::<Vec<_>>(),
        ["c", "controller", "le", "namespace"]
    );
}

/// issue 40: every metric and label the charts' PrometheusRules and dashboards read is in
/// docs/monitoring.md's table for that binary, whose rows the hub's and the agent's unit tests
/// check against their registries (`monitoring_doc_lists_only_exported_metrics`).
#[test]
fn monitoring_objects_read_only_listed_metrics() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring.md"),
    )
    .unwrap();
    const TARGET_LABELS: &[&str] = &["namespace", "container", "pod", "job", "instance"];
    for (chart_name, binary) in [("tender-hub", "hub"), ("tender-agent", "agent")] {
        let listed = tender_runtime::metrics::documented_metrics(&doc, binary);
        let (rules, mut exprs) = monitoring_promql(chart_name);
        exprs.extend(rule_exprs(&rules));
        assert!(exprs.len() >= 10, "{chart_name}: {exprs:?}");
        for expr in &exprs {
            let (metrics, labels) = promql_names(expr);
            assert!(!metrics.is_empty(), "{expr}");
            let mut allowed: Vec<&str> = TARGET_LABELS.to_vec();
            for metric in &metrics {
                if metric == "up" {
                    continue;
                }
                let Some((_, l)) = listed.iter().find(|(m, _)| m == metric) else {
                    panic!(
                        "{chart_name} reads {metric}, not listed for the {binary} in docs/monitoring.md: {expr}"
                    );
                };
                allowed.extend(l.iter().map(String::as_str));
            }
            for label in &labels {
                assert!(
                    allowed.contains(&label.as_str()),
                    "{chart_name} reads label {label}, not listed for {metrics:?}: {expr}"
                );
            }
        }
    }
}

/// The PromQL `chart_name` ships with every toggle on: each PrometheusRule's `spec` (a
/// Prometheus rule file), and every dashboard expression.
fn monitoring_promql(chart_name: &str) -> (Vec<serde_json::Value>, Vec<String>) {
    let (mut rules, mut exprs) = (Vec::new(), Vec::new());
    let mut set = base_values(chart_name);
    set.extend(toggles(chart_name));
    for o in template(chart_name, "tender-system", &set) {
        match kind_of(&o) {
            "PrometheusRule" => rules.push(o.data["spec"].clone()),
            "ConfigMap" if o.metadata.name.as_deref().unwrap().ends_with("-dashboard") => {
                for text in o.data["data"].as_object().unwrap().values() {
                    let dash: serde_json::Value =
                        serde_json::from_str(text.as_str().unwrap()).unwrap();
                    for panel in dash["panels"].as_array().unwrap() {
                        for t in panel["targets"].as_array().unwrap() {
                            exprs.push(t["expr"].as_str().unwrap().to_string());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (rules, exprs)
}

/// Every alert expression in PrometheusRule `specs`.
fn rule_exprs(specs: &[serde_json::Value]) -> Vec<String> {
    specs
        .iter()
        .flat_map(|spec| spec["groups"].as_array().unwrap())
        .flat_map(|group| group["rules"].as_array().unwrap())
        .map(|rule| rule["expr"].as_str().unwrap().to_string())
        .collect()
}

/// issue 40: the rules are valid Prometheus rule files (`promtool check rules`' reader:
/// expressions, durations, label and annotation templates) and every dashboard expression
/// parses, checked by Prometheus's own code built from its Go module (`e2e/tools/promql`).
#[test]
fn monitoring_rules_and_dashboards_parse_as_prometheus_reads_them() {
    let check = tender_e2e::ensure_promql_check().expect("building promql-check");
    let dir = std::env::temp_dir().join(unique_name("tender-promql"));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut rules, mut exprs) = (Vec::new(), Vec::new());
    for chart_name in ["tender-hub", "tender-agent"] {
        let (r, e) = monitoring_promql(chart_name);
        rules.extend(r);
        exprs.extend(e.into_iter().map(|e| e.replace('\n', " ")));
    }
    assert_eq!(rules.len(), 2, "one PrometheusRule per chart");
    let exprs_file = dir.join("exprs.txt");
    std::fs::write(&exprs_file, exprs.join("\n")).unwrap();
    let mut cmd = Command::new(&check);
    cmd.arg("-exprs").arg(&exprs_file);
    for (i, r) in rules.iter().enumerate() {
        let path = dir.join(format!("rules-{i}.json"));
        std::fs::write(&path, r.to_string()).unwrap();
        cmd.arg(path);
    }
    let out = cmd.output().expect("running promql-check");
    // And it refuses what Prometheus refuses, so a pass means something.
    let bad = dir.join("bad.txt");
    std::fs::write(&bad, "sum(rate(x[5m]) by\n").unwrap();
    let refused = Command::new(&check)
        .arg("-exprs")
        .arg(&bad)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stdout).contains("parse error"));
}

/// `scraped` (a live `/metrics`) holds every metric docs/monitoring.md lists for `binary`, each
/// with its listed labels, but the families that have a sample only once something went wrong
/// or was skipped (prometheus-client encodes no family without a sample): their registration
/// is checked by the binaries' unit tests (`monitoring_doc_lists_only_exported_metrics`).
fn assert_exports_listed_metrics(scraped: &str, binary: &str) {
    const ONLY_AFTER_AN_EVENT: &[&str] = &[
        "reconcile_errors_total",
        "tender_object_writes_skipped_total",
        // Counted only for BundleDeployments an agent reported not ready.
        "tender_hub_bundle_deployments_not_ready",
    ];
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring.md"),
    )
    .unwrap();
    let series = tender_runtime::metrics::series_labels(scraped);
    let listed = tender_runtime::metrics::documented_metrics(&doc, binary);
    assert!(listed.len() >= 10, "{listed:?}");
    for (metric, labels) in listed {
        let Some(have) = series.get(&metric) else {
            assert!(
                ONLY_AFTER_AN_EVENT.contains(&metric.as_str()),
                "the running {binary} does not export {metric}:\n{scraped}"
            );
            continue;
        };
        for label in &labels {
            assert!(
                have.contains(label),
                "the running {binary}'s {metric} has no label {label}: {have:?}"
            );
        }
    }
}

/// issue 40: a hub running from the chart's Deployment, after planning a Bundle, exports what
/// docs/monitoring.md lists for it (the agent's side: the sandbox test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_hub_exports_every_listed_metric() {
    use serde_json::json;
    use tender_e2e::fixture::Workspace;
    use tender_e2e::running::{Running, install_hub_chart};

    let env = shared_env_of("charts", 1).await;
    let ws = Workspace::without_hub(env, "chart-hub-metrics").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let hub = Running::start(env, HUB, &deployment, "tender-hub-metrics", &[]).await;
    ws.cluster("east").await;
    ws.source_secret("creds", &[("password", "v1")]).await;
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "downstreamResources": [{"kind": "Secret", "name": "creds"}],
        }),
    )
    .await;
    // Planned and written: a BundleDeployment and a copy for east, and the Bundle's status
    // (the state gauges count the conditions the hub wrote).
    let written = tender_e2e::within(tender_e2e::fixture::WAIT, || async {
        let text = hub.scrape().await;
        [
            "tender_hub_bundle_deployments_written_total 1",
            "tender_hub_copies_written_total 1",
        ]
        .iter()
        .all(|l| text.lines().any(|x| x == *l))
            && text
                .lines()
                .any(|x| x.starts_with("tender_hub_bundle_conditions{type=\"Ready\""))
    })
    .await;
    assert!(written, "the hub wrote nothing:\n{}", hub.log_tail());
    assert_exports_listed_metrics(&hub.scrape().await, "hub");
}
