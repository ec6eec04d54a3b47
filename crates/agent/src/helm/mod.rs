//! Helm charts (`spec.helm`): observe (values and credentials from the planned copies or the
//! downstream cluster, the chart from its repository) → render with a pinned `helm template`
//! → the rendered objects go through the same plan and apply path as inline manifests.
//!
//! Values and credentials live only in memory: values reach helm on stdin, credentials become a
//! basic-auth header (or buy a registry's bearer token), and neither appears in logs, events,
//! status or the chart cache.

mod cache;
mod fetch;
mod oci;
mod render;
mod revision;
mod schema;
mod values;

pub use cache::{CacheEntry, evictions};
pub use fetch::{ChartEntry, select_version};
pub use oci::{
    Challenge, OciRef, chart_layer_digest, docker_config_credentials, parse_challenge,
    parse_reference, select_tag, version_tag,
};
pub use render::{helm_env, parse_rendered, redact, render_args};
pub use revision::{next_release, recorded_revision, rewrite as rewrite_revision};
pub use schema::{external_references, reference_allowed};
pub(crate) use values::pending_copy;
pub use values::{ObjectData, ValueSource, merge_sources, needed_sources};

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use sha2::Digest;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use serde_json::json;
use tender_types::conditions::reason;
use tender_types::hash::value_hash;
use tender_types::{HelmOptions, ObjectRef};

use tender_chartrepo::{Http, Trust};

use crate::config::ChartLimits;
use crate::downstream::Downstream;
use crate::hooks::RenderedChart;
use crate::plan::Planned;
use crate::policy::Reads;

/// Default bound on fetching and rendering one chart.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Clients with a deployment's own trust kept at most (then all are dropped and rebuilt).
const MAX_TRUSTED_CLIENTS: usize = 64;

/// Why a chart could not be rendered: a stable reason (docs/troubleshooting.md) and a message
/// that never quotes values or credentials (the chart-repository client's failure).
pub use tender_chartrepo::Failure as ChartFailure;

/// The status key of a chart that cannot be rendered (it stands for all its objects).
pub fn chart_key(helm: &HelmOptions, release: &str, namespace: &str) -> ObjectRef {
    let _ = helm;
    ObjectRef::new(
        "helm.tender.dev/v1",
        "HelmRelease",
        Some(namespace),
        release,
    )
}

/// The agent's charts: the helm binary, the chart cache, the limits, the archives whose
/// schemas were checked and the last render of each BundleDeployment (so drift passes do not
/// fetch or render again).
pub(crate) struct Charts {
    helm: PathBuf,
    cache: cache::Cache,
    http: Http,
    /// The system roots, and the clients of deployments with their own trust, by its key
    /// (decision 0106-chart-repository-tls).
    roots: tender_chartrepo::RootCertStore,
    trusted: Mutex<HashMap<String, Http>>,
    limits: ChartLimits,
    schemas_checked: Mutex<HashSet<PathBuf>>,
    renders: Mutex<HashMap<String, (String, RenderedChart)>>,
    /// In-process tests: what a chart (by name) renders to, instead of fetching it and
    /// running helm.
    #[cfg(test)]
    prerendered: Mutex<HashMap<String, Result<RenderedChart, ChartFailure>>>,
}

impl Charts {
    pub(crate) fn new(helm: PathBuf, cache_dir: PathBuf, limits: ChartLimits) -> Self {
        let roots = tender_chartrepo::system_roots();
        Self {
            helm,
            cache: cache::Cache::new(cache_dir, limits.cache_max_bytes),
            http: Http::new(
                fetch::AGENT,
                limits.redirect_hosts.clone(),
                Trust::default().client_config(&roots),
            ),
            roots,
            trusted: Mutex::new(HashMap::new()),
            limits,
            schemas_checked: Mutex::new(HashSet::new()),
            renders: Mutex::new(HashMap::new()),
            #[cfg(test)]
            prerendered: Mutex::new(HashMap::new()),
        }
    }

    /// The client for a chart source with `trust` (built once per trust; a few at most).
    fn http_for(&self, trust: &Trust) -> Http {
        if trust.is_system() {
            return self.http.clone();
        }
        let mut clients = self.trusted.lock().expect("chart clients");
        if clients.len() >= MAX_TRUSTED_CLIENTS {
            clients.clear();
        }
        clients
            .entry(trust.key())
            .or_insert_with(|| {
                Http::new(
                    fetch::AGENT,
                    self.limits.redirect_hosts.clone(),
                    trust.client_config(&self.roots),
                )
            })
            .clone()
    }

    /// Refuses an archive whose `values.schema.json` refers outside itself (once per archive:
    /// archives are named by their digest).
    async fn check_schemas(&self, chart: &std::path::Path, name: &str) -> Result<(), ChartFailure> {
        if self
            .schemas_checked
            .lock()
            .expect("schema memo")
            .contains(chart)
        {
            return Ok(());
        }
        let (path, name) = (chart.to_path_buf(), name.to_string());
        tokio::task::spawn_blocking(move || schema::check_archive(&path, &name))
            .await
            .map_err(|e| {
                ChartFailure::new(
                    reason::CHART_RENDER_FAILED,
                    format!("reading the chart: {e}"),
                )
            })??;
        self.schemas_checked
            .lock()
            .expect("schema memo")
            .insert(chart.to_path_buf());
        Ok(())
    }

    /// The rendered objects of `helm` for BundleDeployment `bd`, release namespace `namespace`.
    /// `copies` are this deployment's planned copies: a `valuesFrom` or `helmSecretName` that
    /// names one reads the copy about to be applied, anything else is read downstream — only
    /// what `reads` allows (decision 0077-reads-for-a-bundle-obey-the-owner).
    // The release (namespace, install or upgrade) and where values come from, all needed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn render(
        &self,
        down: &Downstream,
        bd: &str,
        helm: &HelmOptions,
        namespace: &str,
        revision: u32,
        copies: &[Planned],
        files: &[crate::files::File],
        reads: Reads<'_>,
    ) -> Result<RenderedChart, ChartFailure> {
        // A chart carried in the files: its directory must hold its Chart.yaml (checked
        // before anything else, so the condition names the missing file).
        let carried = match helm.files_dir() {
            Some(dir) => Some(Carried::of(files, &dir)?),
            None => None,
        };
        #[cfg(test)]
        if let Some(rendered) = self
            .prerendered
            .lock()
            .expect("prerendered")
            .get(&helm.chart)
        {
            return rendered.clone();
        }
        let timeout = helm
            .timeout_seconds
            .map(|s| Duration::from_secs(u64::from(s)))
            .unwrap_or(DEFAULT_TIMEOUT);
        let mut found: HashMap<ValueSource, Option<ObjectData>> = HashMap::new();
        for source in needed_sources(helm, namespace) {
            let data = match values::from_planned(copies, &source) {
                Some(d) => Some(d),
                None => read_downstream(down, &source, reads).await?,
            };
            found.insert(source, data);
        }
        let merged = merge_sources(helm, namespace, &found)?;
        let auth = values::credentials(helm, namespace, &found)?;
        let trust = Trust::new(
            values::cacerts(helm, namespace, &found),
            helm.insecure_skip_tls_verify,
        )?;
        let release = helm.release_name_or(bd).to_string();
        let memo_key = value_hash(&json!({
            "helm": helm,
            "values": merged,
            "auth": auth.as_ref().map(|(u, p)| value_hash(&json!([u, p]))),
            "namespace": namespace,
            "revision": revision,
            "trust": trust.key(),
            "files": carried.as_ref().map(|c| &c.digest),
        }));
        if let Some((k, objects)) = self.renders.lock().expect("render memo").get(bd)
            && *k == memo_key
        {
            return Ok(objects.clone());
        }
        let http = self.http_for(&trust);
        let work = async {
            let chart = if let Some(carried) = &carried {
                carried.archive(&self.cache)?
            } else if helm.is_oci() {
                oci::fetch_oci(&http, &self.cache, helm, auth.as_ref(), &self.limits).await?
            } else if helm.is_url() {
                fetch::fetch_url(&http, &self.cache, helm, auth.as_ref(), &self.limits).await?
            } else {
                fetch::fetch_chart(&http, &self.cache, helm, auth.as_ref(), &self.limits).await?
            };
            self.check_schemas(&chart, &helm.chart).await?;
            // A later revision renders from a copy whose templates say so
            // (decision 0088-phased-deploy-and-helm-hooks).
            let unpacked = self.cache.dir().join(".revisions").join(&memo_key[..16]);
            let rewritten = if revision > 1 {
                let (archive, into) = (chart.clone(), unpacked.clone());
                tokio::task::spawn_blocking(move || {
                    revision::unpack_for_revision(&archive, &into, revision)
                })
                .await
                .map_err(|e| ChartFailure::new(reason::CHART_RENDER_FAILED, e.to_string()))?
                .map_err(|e| {
                    ChartFailure::new(
                        reason::CHART_RENDER_FAILED,
                        format!("unpacking the chart for revision {revision}: {e}"),
                    )
                })?
            } else {
                None
            };
            let kube_version = down
                .client
                .apiserver_version()
                .await
                .map(|v| v.git_version)
                .ok();
            let api_versions = api_versions(down).await;
            let sandbox = render::Sandbox {
                home: self.cache.dir(),
                max_rendered_bytes: self.limits.max_rendered_bytes,
            };
            let out = render::template(
                &self.helm,
                &sandbox,
                &release,
                namespace,
                revision > 1,
                rewritten.as_deref().unwrap_or(&chart),
                kube_version.as_deref(),
                &api_versions,
                &merged,
            )
            .await;
            if rewritten.is_some() {
                let _ = std::fs::remove_dir_all(&unpacked);
            }
            out
        };
        let objects = match tokio::time::timeout(timeout, work).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ChartFailure::new(
                    reason::CHART_RENDER_FAILED,
                    format!(
                        "fetching and rendering {} took longer than {}s (helm.timeoutSeconds)",
                        helm.chart,
                        timeout.as_secs()
                    ),
                ));
            }
        };
        self.renders
            .lock()
            .expect("render memo")
            .insert(bd.to_string(), (memo_key, objects.clone()));
        Ok(objects)
    }

    /// In-process tests: chart `chart` renders to `rendered` (or fails so) from now on.
    #[cfg(test)]
    pub(crate) fn prerender(&self, chart: &str, rendered: Result<RenderedChart, ChartFailure>) {
        self.prerendered
            .lock()
            .expect("prerendered")
            .insert(chart.to_string(), rendered);
    }

    /// Forgets the render of a deleted BundleDeployment.
    pub(crate) fn forget(&self, bd: &str) {
        self.renders.lock().expect("render memo").remove(bd);
    }
}

/// A chart carried in the deployment's files (decision 0123-files-in-a-bundle): its files and
/// their digest (the render memo's key; the archive is packed only on a miss).
struct Carried<'a> {
    files: &'a [crate::files::File],
    dir: String,
    digest: String,
}

impl<'a> Carried<'a> {
    fn of(files: &'a [crate::files::File], dir: &str) -> Result<Self, ChartFailure> {
        let chart = crate::files::chart_files(files, dir).map_err(files_failure)?;
        let mut h = sha2::Sha256::new();
        for (name, bytes) in &chart {
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        Ok(Self {
            files,
            dir: dir.to_string(),
            digest: hex::encode(h.finalize()),
        })
    }

    /// The chart's archive in the chart cache, named by its own sha256 like a repository's.
    fn archive(&self, cache: &cache::Cache) -> Result<PathBuf, ChartFailure> {
        let archive = crate::files::chart_archive(self.files, &self.dir).map_err(files_failure)?;
        let digest = hex::encode(sha2::Sha256::digest(&archive));
        match cache.get(&digest) {
            Some(path) => Ok(path),
            None => cache.store(&digest, &archive),
        }
    }
}

fn files_failure(e: crate::files::FileError) -> ChartFailure {
    ChartFailure::new(reason::FILES_INVALID, e.to_string())
}

/// Reads a Secret or ConfigMap downstream if the owner's policy lets a Bundle read it
/// (`ReadRefusedByPolicy` otherwise, before reading for its namespace, after for its type);
/// `None` when it does not exist.
async fn read_downstream(
    down: &Downstream,
    source: &ValueSource,
    reads: Reads<'_>,
) -> Result<Option<ObjectData>, ChartFailure> {
    let kind = if source.secret { "Secret" } else { "ConfigMap" };
    let check = |secret_type: Option<&str>| match reads.refusal(
        kind,
        &source.namespace,
        &source.name,
        secret_type,
    ) {
        Some(why) => Err(ChartFailure::new(reason::READ_REFUSED_BY_POLICY, why)),
        None => Ok(()),
    };
    check(None)?;
    let failed = |e: kube::Error| {
        ChartFailure::new(
            reason::VALUES_FROM_MISSING,
            format!(
                "reading {} downstream: {}",
                source.describe(),
                tender_runtime::reconcile::error_text(&e, true)
            ),
        )
    };
    let client = down.client.clone();
    Ok(if source.secret {
        Api::<Secret>::namespaced(client, &source.namespace)
            .get_opt(&source.name)
            .await
            .map_err(failed)?
            .map(|s| check(s.type_.as_deref()).map(|()| ObjectData::from_secret(&s)))
            .transpose()?
    } else {
        Api::<ConfigMap>::namespaced(client, &source.namespace)
            .get_opt(&source.name)
            .await
            .map_err(failed)?
            .map(|c| ObjectData::from_config_map(&c))
    })
}

/// What the downstream cluster serves, for `--api-versions`: every `group/version` and every
/// `group/version/Kind`, as Helm's own `.Capabilities.APIVersions` holds them (charts ask
/// `Has "policy/v1/PodDisruptionBudget"`); only `v1` when discovery fails (helm then uses its
/// built-in defaults).
async fn api_versions(down: &Downstream) -> Vec<String> {
    let mut out = vec!["v1".to_string()];
    if let Ok(found) = kube::discovery::Discovery::new(down.client.clone())
        .run()
        .await
    {
        for group in found.groups() {
            for version in group.versions() {
                let gv = match group.name() {
                    "" => version.to_string(),
                    name => format!("{name}/{version}"),
                };
                for (resource, _) in group.versioned_resources(version) {
                    out.push(format!("{gv}/{}", resource.kind));
                }
                out.push(gv);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
