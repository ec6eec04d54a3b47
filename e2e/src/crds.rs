//! Installing tender's CRDs into a test cluster.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

/// Applies every tender CRD (server-side apply) and waits until each is Established.
/// Idempotent, so every test may call it.
pub async fn install_crds(client: &kube::Client) -> Result<()> {
    for crd in tender_types::crds() {
        apply_crd(client, &crd).await?;
    }
    Ok(())
}

/// Server-side applies one CRD and waits until the apiserver serves it (Established).
pub async fn apply_crd(client: &kube::Client, crd: &CustomResourceDefinition) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply("tender-e2e").force(),
        &Patch::Apply(crd),
    )
    .await
    .with_context(|| format!("applying CRD {name}"))?;
    crate::eventually(
        &format!("CRD {name} Established"),
        Duration::from_secs(60),
        || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let crd = api.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok::<_, kube::Error>(established.then_some(()))
            }
        },
    )
    .await;
    Ok(())
}
