//! Real charts for the end-to-end tests: ingress-nginx and Kyverno, read from their Go module
//! archives (downloaded into Go's module cache by `go mod download`, like Kyverno's CRDs in
//! [`crate::kyverno`]; nothing is committed), packaged with the pinned Helm and served by the
//! loopback chart repository of [`crate::charts`].
//!
//! Besides the charts: what `helm template` renders *with* hooks, grouped the way Helm runs
//! them (phases, weights, kind order), computed here independently of the agent; the check of
//! a recorded downstream order against those phases; and the effects of the charts' hook Jobs
//! (what their containers would do) for the [`crate::kubelet_player::Player`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use base64::Engine;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::charts::{ChartRepo, path_str, run_helm};
use crate::fixture::{Agent, Workspace};
use crate::kubelet_player::{Effect, Recorded, What};

/// The Go module holding ingress-nginx's chart (`charts/ingress-nginx`).
pub const INGRESS_NGINX_MODULE: &str = "k8s.io/ingress-nginx";
/// The module version: the newest the Go module proxy serves (it serves no tagged version of
/// this module); its chart is ingress-nginx 4.11.0 (controller v1.11.0). `.ci/run` reads it.
pub const INGRESS_NGINX_VERSION: &str = "v0.0.0-20240708192948-52c50467d67d";
/// The chart directory inside the ingress-nginx module.
pub const INGRESS_NGINX_CHART: &str = "charts/ingress-nginx";
/// The chart directory inside Kyverno's module (at [`crate::kyverno::KYVERNO_VERSION`]); its
/// dependencies (`crds`, `grafana`) are vendored in the same archive under `charts/`.
pub const KYVERNO_CHART: &str = "charts/kyverno";

/// The Go module holding node-feature-discovery's chart: its `crds/nfd-api-crds.yaml` is
/// controller-gen output that starts with `---` and holds three CRDs (`chart_crds.rs`).
pub const NFD_MODULE: &str = "sigs.k8s.io/node-feature-discovery";
/// The module version (its chart is node-feature-discovery 0.2.1, app v0.17.3). `.ci/run`
/// reads it.
pub const NFD_VERSION: &str = "v0.17.3";
/// The chart directory inside the node-feature-discovery module.
pub const NFD_CHART: &str = "deployment/helm/node-feature-discovery";

/// The Kubernetes version charts are rendered for (their `kubeVersion` constraints).
const KUBE_VERSION: &str = crate::KUBERNETES_VERSION;

/// The chart directory of ingress-nginx in Go's module cache (downloaded if needed).
pub fn ingress_nginx_chart_dir() -> Result<PathBuf> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/real-charts");
    Ok(
        crate::build::go_module_dir(&tools, INGRESS_NGINX_MODULE, INGRESS_NGINX_VERSION)?
            .join(INGRESS_NGINX_CHART),
    )
}

/// The chart directory of node-feature-discovery in Go's module cache (downloaded if needed).
pub fn nfd_chart_dir() -> Result<PathBuf> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/real-charts");
    Ok(crate::build::go_module_dir(&tools, NFD_MODULE, NFD_VERSION)?.join(NFD_CHART))
}

/// A writable copy of chart directory `src` under `dest` (module archives are read-only), so
/// a test can add a template to a real chart.
pub fn copy_chart(src: &Path, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let to = dest.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_chart(&entry.path(), &to)?;
        } else {
            std::fs::write(&to, std::fs::read(entry.path())?)?;
        }
    }
    Ok(())
}

/// The chart directory of Kyverno in Go's module cache (downloaded if needed).
pub fn kyverno_chart_dir() -> Result<PathBuf> {
    Ok(crate::kyverno::module_dir()?.join(KYVERNO_CHART))
}

/// Both charts packaged and served (basic auth) on loopback.
pub struct RealCharts {
    /// The repository serving `ingress-nginx` and `kyverno`.
    pub repo: ChartRepo,
    /// The pinned Helm CLI.
    pub helm: PathBuf,
    /// Chart name → (version, archive).
    pub charts: BTreeMap<String, (String, PathBuf)>,
}

impl RealCharts {
    /// Packages ingress-nginx and Kyverno from their module archives and serves them.
    pub async fn start(user: &str, password: &str) -> Result<RealCharts> {
        Self::serve(
            user,
            password,
            &[
                ("ingress-nginx", ingress_nginx_chart_dir()?),
                ("kyverno", kyverno_chart_dir()?),
            ],
        )
        .await
    }

    /// Packages the charts `(name, directory)` (each named `name` in its Chart.yaml) and
    /// serves them.
    pub async fn serve(
        user: &str,
        password: &str,
        sources: &[(&str, PathBuf)],
    ) -> Result<RealCharts> {
        let helm = crate::ensure_helm()?;
        let root = std::env::temp_dir().join(crate::unique_name("tender-real-charts"));
        let dir = root.join("repo");
        std::fs::create_dir_all(&dir)?;
        let mut charts = BTreeMap::new();
        for (name, src) in sources {
            let meta: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(src.join("Chart.yaml"))
                    .with_context(|| format!("reading {}", src.display()))?,
            )?;
            let version = meta["version"].as_str().context("Chart.yaml version")?;
            // `helm package` checks that every dependency is in charts/ (no download).
            run_helm(&helm, &["package", path_str(src)?, "-d", path_str(&dir)?])?;
            let archive = dir.join(format!("{name}-{version}.tgz"));
            if !archive.exists() {
                bail!("helm package did not write {}", archive.display());
            }
            charts.insert(name.to_string(), (version.to_string(), archive));
        }
        run_helm(&helm, &["repo", "index", path_str(&dir)?])?;
        let repo = ChartRepo::serve_dir(root, dir, user, password).await?;
        Ok(RealCharts { repo, helm, charts })
    }

    /// The version of chart `name`.
    pub fn version(&self, name: &str) -> &str {
        &self.charts[name].0
    }

    /// `helm template` of chart `name` as release `release` in `ns` with `values`, WITH hooks
    /// (`--skip-tests`, `--include-crds`, `--is-upgrade` for an upgrade).
    pub fn template(
        &self,
        name: &str,
        release: &str,
        ns: &str,
        values: &Value,
        upgrade: bool,
    ) -> Result<Vec<Rendered>> {
        let archive = &self.charts[name].1;
        let values_file =
            archive.with_extension(format!("{}.values.json", crate::unique_name("v")));
        std::fs::write(&values_file, serde_json::to_vec(values)?)?;
        let mut args = vec![
            "template",
            release,
            path_str(archive)?,
            "--namespace",
            ns,
            "--skip-tests",
            "--include-crds",
            "--kube-version",
            KUBE_VERSION,
            "--values",
            path_str(&values_file)?,
        ];
        if upgrade {
            args.push("--is-upgrade");
        }
        let out = run_helm(&self.helm, &args);
        let _ = std::fs::remove_file(&values_file);
        parse_rendered(&out?, ns)
    }
}

/// One object `helm template` rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// Its namespace as rendered (None: not set, e.g. cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The hook phases it runs in (`helm.sh/hook`), empty for an ordinary object.
    pub hooks: Vec<String>,
    /// `helm.sh/hook-weight` (0 when absent).
    pub weight: i64,
    /// `helm.sh/hook-delete-policy` (`before-hook-creation` when a hook gives none).
    pub delete_policies: Vec<String>,
    /// `helm.sh/resource-policy: keep`.
    pub keep: bool,
    /// The body.
    pub body: Value,
}

impl Rendered {
    /// Whether it is a hook.
    pub fn is_hook(&self) -> bool {
        !self.hooks.is_empty()
    }

    /// The key the [`crate::kubelet_player::Recorder`] records it under.
    pub fn key(&self) -> (String, Option<String>, String) {
        (self.kind.clone(), self.namespace.clone(), self.name.clone())
    }

    /// `kind ns/name` (or `kind name`).
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// Whether `kind` is cluster-scoped among the kinds these charts render.
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "ClusterRole"
            | "ClusterRoleBinding"
            | "CustomResourceDefinition"
            | "IngressClass"
            | "ValidatingWebhookConfiguration"
            | "MutatingWebhookConfiguration"
            | "Namespace"
            | "PriorityClass"
            | "StorageClass"
            | "APIService"
    )
}

/// Parses `helm template` output; namespaced objects without a namespace get `ns`.
pub fn parse_rendered(text: &str, ns: &str) -> Result<Vec<Rendered>> {
    let docs = serde_saphyr::from_multiple::<Option<Value>>(text)?;
    let mut out = Vec::new();
    for body in docs.into_iter().flatten() {
        if !body.is_object() {
            continue;
        }
        let kind = body["kind"].as_str().unwrap_or_default().to_string();
        let annotations = &body["metadata"]["annotations"];
        let list = |key: &str| -> Vec<String> {
            annotations[key]
                .as_str()
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let hooks = list("helm.sh/hook");
        let mut delete_policies = list("helm.sh/hook-delete-policy");
        if !hooks.is_empty() && delete_policies.is_empty() {
            delete_policies.push("before-hook-creation".into());
        }
        let namespace = body["metadata"]["namespace"]
            .as_str()
            .map(str::to_string)
            .or_else(|| (!cluster_scoped(&kind)).then(|| ns.to_string()));
        out.push(Rendered {
            api_version: body["apiVersion"].as_str().unwrap_or_default().to_string(),
            kind,
            namespace,
            name: body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            weight: annotations["helm.sh/hook-weight"]
                .as_str()
                .and_then(|w| w.trim().parse().ok())
                .unwrap_or(0),
            keep: annotations["helm.sh/resource-policy"].as_str() == Some("keep"),
            hooks,
            delete_policies,
            body,
        });
    }
    Ok(out)
}

/// Helm's install order of kinds (`releaseutil.InstallOrder`); unknown kinds go last.
pub fn kind_rank(kind: &str) -> usize {
    const ORDER: &[&str] = &[
        "PriorityClass",
        "Namespace",
        "NetworkPolicy",
        "ResourceQuota",
        "LimitRange",
        "PodSecurityPolicy",
        "PodDisruptionBudget",
        "ServiceAccount",
        "Secret",
        "SecretList",
        "ConfigMap",
        "StorageClass",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleList",
        "ClusterRoleBinding",
        "ClusterRoleBindingList",
        "Role",
        "RoleList",
        "RoleBinding",
        "RoleBindingList",
        "Service",
        "DaemonSet",
        "Pod",
        "ReplicationController",
        "ReplicaSet",
        "Deployment",
        "HorizontalPodAutoscaler",
        "StatefulSet",
        "Job",
        "CronJob",
        "IngressClass",
        "Ingress",
        "APIService",
    ];
    ORDER.iter().position(|k| *k == kind).unwrap_or(ORDER.len())
}

/// The hooks of `phase` (e.g. `pre-install`) in the order Helm runs them: by weight, then
/// name, then kind order (Helm sorts by kind first and then stably by weight and name).
pub fn hook_phase<'a>(objs: &'a [Rendered], phase: &str) -> Vec<&'a Rendered> {
    let mut hooks: Vec<&Rendered> = objs
        .iter()
        .filter(|o| o.hooks.iter().any(|h| h == phase))
        .collect();
    hooks.sort_by(|a, b| {
        (a.weight, &a.name, kind_rank(&a.kind)).cmp(&(b.weight, &b.name, kind_rank(&b.kind)))
    });
    hooks
}

/// The chart's ordinary objects (no hook annotation).
pub fn ordinary(objs: &[Rendered]) -> Vec<&Rendered> {
    objs.iter().filter(|o| !o.is_hook()).collect()
}

/// Every (`apiVersion`, `kind`) rendered.
pub fn kinds(objs: &[Rendered]) -> BTreeSet<(String, String)> {
    objs.iter()
        .map(|o| (o.api_version.clone(), o.kind.clone()))
        .collect()
}

/// The names of the cluster-scoped objects rendered.
pub fn cluster_names(objs: &[Rendered]) -> BTreeSet<String> {
    objs.iter()
        .filter(|o| o.namespace.is_none())
        .map(|o| o.name.clone())
        .collect()
}

/// One step of a rollout in the order the test expects.
#[derive(Debug, Clone)]
pub enum Step<'a> {
    /// Hooks run one after the other: each created (a Job or Pod also finished) after the
    /// step before it.
    Hooks(&'a str, Vec<&'a Rendered>),
    /// Objects each written (created or changed) after the step before, in any order among
    /// themselves; their first write since the rollout began comes after that step.
    Written(&'a str, Vec<&'a Rendered>),
    /// Objects each deleted (deletion started) after the step before, none earlier.
    Deleted(&'a str, Vec<&'a Rendered>),
}

fn is_key(e: &Recorded, o: &Rendered) -> bool {
    e.kind == o.kind && e.namespace == o.namespace && e.name == o.name
}

/// Checks the recorded `events` (ordered by resourceVersion) since `start` against `steps`;
/// returns the resourceVersion where the last step ended, or what broke the order.
pub fn check_order(events: &[Recorded], start: u64, steps: &[Step]) -> Result<u64, String> {
    let mut cursor = start;
    let since: Vec<&Recorded> = events.iter().filter(|e| e.rv > start).collect();
    for step in steps {
        match step {
            Step::Hooks(phase, hooks) => {
                for h in hooks {
                    let created = since
                        .iter()
                        .find(|e| e.rv > cursor && e.what == What::Created && is_key(e, h));
                    let Some(created) = created else {
                        // A hook of two phases of one rollout (e.g. pre- and post-install) that
                        // an earlier phase created and nothing deleted since has run already.
                        if alive_at(&since, h, cursor) && !matches!(h.kind.as_str(), "Job" | "Pod")
                        {
                            continue;
                        }
                        return Err(format!(
                            "{phase}: hook {} not created after rv {cursor}",
                            h.describe()
                        ));
                    };
                    cursor = created.rv;
                    if matches!(h.kind.as_str(), "Job" | "Pod") {
                        let done = since
                            .iter()
                            .find(|e| {
                                e.uid == created.uid
                                    && matches!(e.what, What::Succeeded | What::Failed)
                            })
                            .ok_or_else(|| {
                                format!("{phase}: hook {} never finished", h.describe())
                            })?;
                        cursor = done.rv;
                    }
                }
            }
            Step::Written(what, objs) | Step::Deleted(what, objs) => {
                let deleting = matches!(step, Step::Deleted(..));
                let mut end = cursor;
                for o in objs {
                    let first = since
                        .iter()
                        .find(|e| {
                            is_key(e, o)
                                && if deleting {
                                    matches!(e.what, What::Deleting | What::Deleted)
                                } else {
                                    matches!(e.what, What::Created | What::Modified)
                                }
                        })
                        .ok_or_else(|| format!("{what}: {} never happened", o.describe()))?;
                    if first.rv <= cursor {
                        return Err(format!(
                            "{what}: {} at rv {} before the step before it ended (rv {cursor})",
                            o.describe(),
                            first.rv
                        ));
                    }
                    end = end.max(first.rv);
                }
                cursor = end;
            }
        }
    }
    Ok(cursor)
}

/// Whether `o` was created since the rollout began and not deleted up to `rv`.
fn alive_at(since: &[&Recorded], o: &Rendered, rv: u64) -> bool {
    let mut alive = false;
    for e in since.iter().filter(|e| e.rv <= rv && is_key(e, o)) {
        match e.what {
            What::Created => alive = true,
            What::Deleted => alive = false,
            _ => {}
        }
    }
    alive
}

/// Per object key, creations and deletions alternate: a hook is never created again while
/// the object before it still exists (`before-hook-creation` deleted it first).
pub fn check_no_overlap(events: &[Recorded]) -> Result<(), String> {
    let mut alive: BTreeMap<(String, Option<String>, String), String> = BTreeMap::new();
    for e in events {
        let key = (e.kind.clone(), e.namespace.clone(), e.name.clone());
        match e.what {
            What::Created | What::Existing => {
                if let Some(old) = alive.insert(key.clone(), e.uid.clone())
                    && old != e.uid
                {
                    return Err(format!("{key:?} created (rv {}) while {old} existed", e.rv));
                }
            }
            What::Deleted => {
                alive.remove(&key);
            }
            _ => {}
        }
    }
    Ok(())
}

fn api(
    client: &kube::Client,
    ns: Option<&str>,
    gvk: (&str, &str, &str),
    plural: &str,
) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(gvk.0, gvk.1, gvk.2), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// The value of `--flag=` among a Job's container args.
fn job_arg(job: &DynamicObject, flag: &str) -> Option<String> {
    let prefix = format!("--{flag}=");
    job.data["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()?
        .iter()
        .filter_map(|a| a.as_str())
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

/// ingress-nginx's `admission-create` Job (kube-webhook-certgen `create`): makes the Secret
/// `--secret-name` (`key`, `cert`, `ca`) in the Job's namespace unless it exists.
pub fn certgen_create() -> Effect {
    Arc::new(|client, job| {
        Box::pin(async move {
            let ns = job.metadata.namespace.clone().context("a namespaced Job")?;
            let name = job_arg(&job, "secret-name").context("--secret-name")?;
            let secrets = api(&client, Some(&ns), ("", "v1", "Secret"), "secrets");
            if secrets.get_opt(&name).await?.is_some() {
                return Ok(());
            }
            let ca = rcgen::generate_simple_self_signed(vec!["ingress-nginx-ca".to_string()])?;
            let leaf = rcgen::generate_simple_self_signed(vec![format!("{name}.{ns}.svc")])?;
            let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
            let body = json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": ns},
                "data": {
                    "ca": b64(ca.cert.pem()),
                    "cert": b64(leaf.cert.pem()),
                    "key": b64(leaf.signing_key.serialize_pem()),
                }
            });
            secrets
                .create(&Default::default(), &serde_json::from_value(body)?)
                .await?;
            Ok(())
        })
    })
}

/// ingress-nginx's `admission-patch` Job (kube-webhook-certgen `patch`): sets every webhook's
/// `caBundle` of ValidatingWebhookConfiguration `--webhook-name` to the Secret's `ca` (and
/// `failurePolicy` to `--patch-failure-policy`); fails when the Secret is missing.
pub fn certgen_patch() -> Effect {
    Arc::new(|client, job| {
        Box::pin(async move {
            let ns = job.metadata.namespace.clone().context("a namespaced Job")?;
            let secret = job_arg(&job, "secret-name").context("--secret-name")?;
            let webhook = job_arg(&job, "webhook-name").context("--webhook-name")?;
            let policy = job_arg(&job, "patch-failure-policy");
            let s = api(&client, Some(&ns), ("", "v1", "Secret"), "secrets")
                .get(&secret)
                .await
                .with_context(|| format!("Secret {ns}/{secret}"))?;
            let ca = s.data["data"]["ca"]
                .as_str()
                .context("the Secret's ca")?
                .to_string();
            let vwcs = api(
                &client,
                None,
                (
                    "admissionregistration.k8s.io",
                    "v1",
                    "ValidatingWebhookConfiguration",
                ),
                "validatingwebhookconfigurations",
            );
            let vwc = vwcs.get(&webhook).await?;
            let webhooks: Vec<Value> = vwc.data["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|w| {
                    let mut p = json!({"name": w["name"], "clientConfig": {"caBundle": ca}});
                    if let Some(policy) = &policy {
                        p["failurePolicy"] = json!(policy);
                    }
                    p
                })
                .collect();
            vwcs.patch(
                &webhook,
                &PatchParams::default(),
                &Patch::Strategic(json!({"webhooks": webhooks})),
            )
            .await?;
            Ok(())
        })
    })
}

/// Kyverno's `scale-to-zero` pre-delete Job: scales the Deployments labelled
/// `app.kubernetes.io/part-of=<release>-kyverno` to zero and deletes the webhook
/// configurations labelled `webhook.kyverno.io/managed-by=kyverno`.
pub fn kyverno_scale_to_zero(release: &str) -> Effect {
    let part_of = format!("app.kubernetes.io/part-of={release}-kyverno");
    Arc::new(move |client, job| {
        let part_of = part_of.clone();
        Box::pin(async move {
            let ns = job.metadata.namespace.clone().context("a namespaced Job")?;
            let deployments = api(
                &client,
                Some(&ns),
                ("apps", "v1", "Deployment"),
                "deployments",
            );
            for d in deployments
                .list(&ListParams::default().labels(&part_of))
                .await?
            {
                let name = d.metadata.name.clone().unwrap_or_default();
                deployments
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": 0}})),
                    )
                    .await?;
            }
            for (kind, plural) in [
                (
                    "ValidatingWebhookConfiguration",
                    "validatingwebhookconfigurations",
                ),
                (
                    "MutatingWebhookConfiguration",
                    "mutatingwebhookconfigurations",
                ),
            ] {
                let hooks = api(
                    &client,
                    None,
                    ("admissionregistration.k8s.io", "v1", kind),
                    plural,
                );
                let lp = ListParams::default().labels("webhook.kyverno.io/managed-by=kyverno");
                for h in hooks.list(&lp).await? {
                    hooks
                        .delete(
                            &h.metadata.name.unwrap_or_default(),
                            &DeleteParams::default(),
                        )
                        .await?;
                }
            }
            Ok(())
        })
    })
}

/// Kyverno's `remove-configmap` post-delete Job: deletes the ConfigMap `<release>-kyverno`
/// the chart keeps (`helm.sh/resource-policy: keep`).
pub fn kyverno_remove_configmap(release: &str) -> Effect {
    let name = format!("{release}-kyverno");
    Arc::new(move |client, job| {
        let name = name.clone();
        Box::pin(async move {
            let ns = job.metadata.namespace.clone().context("a namespaced Job")?;
            api(&client, Some(&ns), ("", "v1", "ConfigMap"), "configmaps")
                .delete(&name, &DeleteParams::default())
                .await?;
            Ok(())
        })
    })
}

/// The object `o` downstream, if it exists (its kind found by discovery).
pub async fn get(client: &kube::Client, o: &Rendered) -> Result<Option<DynamicObject>> {
    let (group, version) = o
        .api_version
        .split_once('/')
        .unwrap_or(("", &o.api_version));
    let gvk = GroupVersionKind::gvk(group, version, &o.kind);
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match &o.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    Ok(api.get_opt(&o.name).await?)
}

/// Real charts are large (Kyverno renders 11 CRDs, 3.4 MB): longer than the fixtures' wait.
pub const ROLLOUT: std::time::Duration = std::time::Duration::from_secs(240);

/// An agent on downstream `downstream` that renders charts ([`Workspace::helm_agent`]) for a
/// downstream owner who installs cluster infrastructure: its policy refuses no kind (the real
/// charts bring ClusterRoles, webhook configurations and CRDs, which the default refuses).
pub async fn infrastructure_agent(ws: &Workspace, cluster: &str, downstream: &str) -> Agent {
    let helm = crate::ensure_helm().expect("building helm");
    let cache = std::env::temp_dir().join(crate::unique_name("tender-chart-cache"));
    ws.agent_configured(cluster, downstream, |c| {
        c.helm_path = helm;
        c.chart_cache_dir = cache;
        c.policy.refused_kinds = Vec::new();
    })
    .await
}

/// Waits (up to [`ROLLOUT`]) until `cluster`'s BundleDeployment of `bundle` has its
/// deploymentID applied and is Ready. With `no_conflict`, any object reported in Conflict on
/// the way fails the test at once.
pub async fn rolled_out(ws: &Workspace, cluster: &str, bundle: &str, no_conflict: bool) {
    use tender_types::ObjectState;
    use tender_types::conditions::{TYPE_READY, is_true};
    let api = ws.bds(cluster);
    crate::eventually(
        &format!("{bundle} rolled out on {cluster}"),
        ROLLOUT,
        || async {
            let Some(bd) = api.get_opt(bundle).await.map_err(|e| e.to_string())? else {
                return Err("no BundleDeployment yet".to_string());
            };
            let s = bd.status.clone().unwrap_or_default();
            if no_conflict {
                let conflicts: Vec<String> = s
                    .resources
                    .iter()
                    .filter(|r| r.state == ObjectState::Conflict)
                    .map(|r| format!("{} {}: {:?}", r.kind, r.name, r.message))
                    .collect();
                assert!(conflicts.is_empty(), "Conflict reported: {conflicts:?}");
            }
            if s.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                && is_true(&s.conditions, TYPE_READY)
            {
                return Ok(Some(()));
            }
            // Shown when the wait times out.
            Err(s
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect::<Vec<_>>()
                .join(" | "))
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(kind: &str, name: &str, hooks: &str, weight: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: {kind}\nmetadata:\n  name: {name}\n  annotations:\n    \
             helm.sh/hook: \"{hooks}\"\n    helm.sh/hook-weight: \"{weight}\"\n"
        )
    }

    #[test]
    fn hooks_run_by_weight_then_name_then_kind() {
        let text = [
            rendered("Job", "b", "pre-install", "0"),
            rendered("ServiceAccount", "b", "pre-install,post-install", "0"),
            rendered("Job", "a", "pre-install", "5"),
            rendered("ConfigMap", "z", "pre-install", "-1"),
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain\n".to_string(),
        ]
        .concat();
        let objs = parse_rendered(&text, "ns").unwrap();
        let order: Vec<String> = hook_phase(&objs, "pre-install")
            .iter()
            .map(|o| format!("{}/{}", o.kind, o.name))
            .collect();
        assert_eq!(order, ["ConfigMap/z", "ServiceAccount/b", "Job/b", "Job/a"]);
        assert_eq!(hook_phase(&objs, "post-install").len(), 1);
        assert_eq!(ordinary(&objs).len(), 1);
        assert_eq!(objs[0].delete_policies, ["before-hook-creation"]);
        assert_eq!(objs[0].namespace.as_deref(), Some("ns"));
    }

    fn ev(rv: u64, kind: &str, name: &str, uid: &str, what: What) -> Recorded {
        Recorded {
            rv,
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: name.into(),
            uid: uid.into(),
            what,
        }
    }

    #[test]
    fn the_order_check_needs_each_phase_after_the_one_before() {
        let text = [
            rendered("ServiceAccount", "a-sa", "pre-install", "0"),
            rendered("Job", "b-job", "pre-install", "0"),
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n".to_string(),
        ]
        .concat();
        let objs = parse_rendered(&text, "ns").unwrap();
        let steps = [
            Step::Hooks("pre-install", hook_phase(&objs, "pre-install")),
            Step::Written("ordinary", ordinary(&objs)),
        ];
        let good = [
            ev(10, "ServiceAccount", "a-sa", "1", What::Created),
            ev(11, "Job", "b-job", "2", What::Created),
            ev(12, "Job", "b-job", "2", What::Succeeded),
            ev(13, "ConfigMap", "cm", "3", What::Created),
        ];
        assert_eq!(check_order(&good, 0, &steps), Ok(13));
        // The ConfigMap before the Job finished.
        let early = [
            ev(10, "ServiceAccount", "a-sa", "1", What::Created),
            ev(11, "Job", "b-job", "2", What::Created),
            ev(12, "ConfigMap", "cm", "3", What::Created),
            ev(13, "Job", "b-job", "2", What::Succeeded),
        ];
        assert!(
            check_order(&early, 0, &steps)
                .unwrap_err()
                .contains("ConfigMap ns/cm")
        );
        // The Job before the ServiceAccount.
        let swapped = [
            ev(10, "Job", "b-job", "2", What::Created),
            ev(11, "Job", "b-job", "2", What::Succeeded),
            ev(12, "ServiceAccount", "a-sa", "1", What::Created),
            ev(13, "ConfigMap", "cm", "3", What::Created),
        ];
        assert!(check_order(&swapped, 0, &steps).is_err());
        let twice = [
            ev(10, "Job", "b-job", "2", What::Created),
            ev(11, "Job", "b-job", "4", What::Created),
        ];
        assert!(check_no_overlap(&twice).is_err());
    }
}
