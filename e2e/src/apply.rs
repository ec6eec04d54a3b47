//! `kubectl apply -f` and `kubectl delete -f` for tests: every object of a multi-document
//! YAML text, server-side applied (or deleted) through discovery, so cluster-scoped and
//! namespaced kinds, built-in or custom, all work.

use anyhow::{Context, Result};
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};

/// The objects of a multi-document YAML text (empty documents skipped).
pub fn parse_objects(yaml: &str) -> Result<Vec<DynamicObject>> {
    Ok(serde_saphyr::from_multiple::<Option<DynamicObject>>(yaml)
        .context("parsing YAML objects")?
        .into_iter()
        .flatten()
        .collect())
}

async fn api_for(
    client: &kube::Client,
    discovery: &Discovery,
    obj: &DynamicObject,
) -> Result<Api<DynamicObject>> {
    let types = obj
        .types
        .as_ref()
        .context("object without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types)?;
    let (ar, caps) = discovery
        .resolve_gvk(&gvk)
        .with_context(|| format!("{} {} is not served", types.api_version, types.kind))?;
    Ok(match caps.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj.metadata.namespace.as_deref().unwrap_or("default"),
            &ar,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    })
}

/// Server-side applies every object of `yaml` with field manager `kubectl`, in order.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<Vec<DynamicObject>> {
    let objects = parse_objects(yaml)?;
    let discovery = Discovery::new(client.clone()).run().await?;
    let pp = PatchParams::apply("kubectl").force();
    let mut applied = Vec::new();
    for obj in &objects {
        let name = obj.metadata.name.clone().context("object without a name")?;
        let api = api_for(client, &discovery, obj).await?;
        applied.push(
            api.patch(&name, &pp, &Patch::Apply(obj))
                .await
                .with_context(|| format!("applying {:?} {name}", obj.types))?,
        );
    }
    Ok(applied)
}

/// Deletes every object of `yaml` (already gone is fine).
pub async fn delete_yaml(client: &kube::Client, yaml: &str) -> Result<()> {
    let discovery = Discovery::new(client.clone()).run().await?;
    for obj in parse_objects(yaml)?.iter().rev() {
        let name = obj.metadata.name.clone().context("object without a name")?;
        let api = api_for(client, &discovery, obj).await?;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {name}")),
        }
    }
    Ok(())
}
