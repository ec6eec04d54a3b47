//! `tender status`: Bundles and Clusters of a workspace at a glance.

use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::api::{Api, ListParams};
use tender_types::{Bundle, Cluster, conditions};

/// Arguments of `tender status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workspace namespace on the hub.
    #[arg(
        long,
        short = 'n',
        default_value = "tender-default",
        env = "TENDER_WORKSPACE"
    )]
    pub workspace: String,
    /// Kubeconfig of the hub (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "TENDER_HUB_KUBECONFIG")]
    pub hub_kubeconfig: Option<PathBuf>,
}

/// One line per Bundle and per Cluster, `kubectl get`-style.
pub fn render(bundles: &[Bundle], clusters: &[Cluster]) -> String {
    use kube::ResourceExt;
    let mut out = format!(
        "{:<32} {:<14} {:<10} {}\n",
        "BUNDLE", "CLUSTERS-READY", "READY", "MESSAGE"
    );
    for b in bundles {
        let status = b.status.clone().unwrap_or_default();
        let ready = conditions::find_condition(&status.conditions, conditions::TYPE_READY);
        out.push_str(&format!(
            "{:<32} {:<14} {:<10} {}\n",
            b.name_any(),
            status.display.map(|d| d.ready_clusters).unwrap_or_default(),
            ready.map(|c| c.status.as_str()).unwrap_or("Unknown"),
            ready.map(|c| c.message.clone()).unwrap_or_default(),
        ));
    }
    out.push_str(&format!(
        "\n{:<32} {:<6} {:<24} {:<14} {}\n",
        "CLUSTER", "MODE", "STATE", "BUNDLES-READY", "NAMESPACE"
    ));
    for c in clusters {
        let status = c.status.clone().unwrap_or_default();
        // The spec decides the mode; the status says so once the hub has seen it.
        let mode = status.mode.unwrap_or_else(|| c.spec.mode());
        let display = status.display.unwrap_or_default();
        out.push_str(&format!(
            "{:<32} {:<6} {:<24} {:<14} {}\n",
            c.name_any(),
            mode.to_string(),
            display.state,
            display.ready_bundles,
            status.namespace.unwrap_or_default(),
        ));
    }
    out
}

/// Runs `tender status`.
pub async fn run(args: Args) -> Result<()> {
    let hub = tender_runtime::client(args.hub_kubeconfig.as_deref(), None, "tender-cli")
        .await
        .context("connecting to the hub")?;
    let bundles = Api::<Bundle>::namespaced(hub.clone(), &args.workspace)
        .list(&ListParams::default())
        .await
        .context("listing Bundles")?;
    let clusters = Api::<Cluster>::namespaced(hub, &args.workspace)
        .list(&ListParams::default())
        .await
        .context("listing Clusters")?;
    print!("{}", render(&bundles.items, &clusters.items));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::{
        ClusterDisplay, ClusterMode, ClusterSpec, ClusterStatus, KubeconfigSecretRef,
    };

    #[test]
    fn clusters_show_their_mode_and_state() {
        let pull = Cluster::new("east", ClusterSpec::default());
        let mut push = Cluster::new(
            "edge",
            ClusterSpec {
                kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                    name: "edge-kubeconfig".into(),
                    key: None,
                }),
                ..Default::default()
            },
        );
        push.status = Some(ClusterStatus {
            mode: Some(ClusterMode::Push),
            display: Some(ClusterDisplay {
                ready_bundles: "0/1".into(),
                state: "KubeconfigExecNotAllowed".into(),
            }),
            ..Default::default()
        });
        let out = render(&[], &[pull, push]);
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .to_string()
        };
        assert!(line("east").contains(" Pull "), "{out}");
        let edge = line("edge");
        assert!(
            edge.contains(" Push ") && edge.contains("KubeconfigExecNotAllowed "),
            "{out}"
        );
        assert!(out.contains(" MODE "), "{out}");
    }
}
