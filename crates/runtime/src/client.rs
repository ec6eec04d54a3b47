//! Kubernetes client construction, with every apiserver request counted by verb.
//!
//! The hub proves "no writes while idle" by reading `kube_requests_total`, so the count has to
//! come from the transport, not from call sites that could forget to report.

use std::{
    path::Path,
    sync::Arc,
    task::{Context, Poll},
};

use http::{HeaderValue, Method, Request, Uri, header::USER_AGENT};
use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use tower::{Layer, Service};

use crate::{Error, Metrics, Result};

/// Builds a client from `kubeconfig` if given, else from the environment (in-cluster service
/// account, then `$KUBECONFIG` / `~/.kube/config`).
///
/// With `metrics`, every request is counted in `kube_requests_total{verb,resource,subresource}`.
/// Requests are counted once each as they leave the client, before kube's internal retries, so
/// the count is the number of API calls the program made.
pub async fn client(
    kubeconfig: Option<&Path>,
    metrics: Option<Arc<Metrics>>,
    user_agent: &str,
) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let load = async {
                let file = Kubeconfig::read_from(path)?;
                Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await
            };
            load.await.map_err(|source| Error::Kubeconfig {
                path: path.to_owned(),
                source,
            })?
        }
        None => Config::infer().await?,
    };
    client_from_config(config, metrics, user_agent)
}

/// Like [`client()`] but from a ready `Config`, e.g. one the e2e harness built in memory.
pub fn client_from_config(
    mut config: Config,
    metrics: Option<Arc<Metrics>>,
    user_agent: &str,
) -> Result<Client> {
    // A distinct user agent lets apiserver audit logs and APF tell hub, agent and CLI apart.
    let agent =
        HeaderValue::from_str(user_agent).map_err(|_| Error::UserAgent(user_agent.to_owned()))?;
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, agent));

    let builder = ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(match metrics {
        Some(metrics) => builder.with_layer(&CountRequestsLayer { metrics }).build(),
        None => builder.build(),
    })
}

/// What one apiserver request does, in Kubernetes terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestClass {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`,
    /// or the lowercase HTTP method for anything else.
    pub verb: &'static str,
    /// Resource plural (`secrets`); empty for discovery and other non-resource paths.
    pub resource: String,
    /// Subresource (`status`, `scale`); empty when the request targets the object itself.
    pub subresource: String,
}

/// Namespace subresources; `/api/v1/namespaces/x/<one of these>` is not a resource collection.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// Whether what follows `namespaces/<ns>` still addresses the Namespace object itself.
fn is_namespace_itself(tail: &[&str]) -> bool {
    match tail {
        [] => true,
        [one] => NAMESPACE_SUBRESOURCES.contains(one),
        _ => false,
    }
}

/// Maps an HTTP request to the Kubernetes verb and resource it acts on, from method, path and
/// the `watch` query parameter only (the path is the one kube builds, without the server URL).
pub fn classify(method: &Method, uri: &Uri) -> RequestClass {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[],
    };
    // `namespaces/<ns>/<resource>...` scopes a namespaced resource, while `namespaces`,
    // `namespaces/<ns>` and `namespaces/<ns>/status` are the Namespace resource itself.
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !is_namespace_itself(tail) => tail,
        _ => rest,
    };
    let (resource, is_item, subresource) = match rest {
        [] => ("", false, ""),
        [resource] => (*resource, false, ""),
        [resource, _name] => (*resource, true, ""),
        [resource, _name, subresource, ..] => (*resource, true, *subresource),
    };
    let is_collection = !is_item && !resource.is_empty();
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));

    let verb = match *method {
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if is_collection => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if is_collection => "deletecollection",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        Method::CONNECT => "connect",
        Method::TRACE => "trace",
        _ => "other",
    };
    RequestClass {
        verb,
        resource: resource.to_owned(),
        subresource: subresource.to_owned(),
    }
}

/// Tower layer that counts each request into [`Metrics`] before passing it on unchanged.
#[derive(Clone)]
pub(crate) struct CountRequestsLayer {
    pub(crate) metrics: Arc<Metrics>,
}

impl<S> Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountRequests {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct CountRequests<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B> Service<Request<B>> for CountRequests<S>
where
    S: Service<Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let class = classify(request.method(), request.uri());
        self.metrics
            .kube_request(class.verb, &class.resource, &class.subresource);
        // A watch is answered at once and then streams: only other requests are "in flight"
        // (a stuck write shows here; the bench's idle check waits for none).
        let in_flight = (class.verb != "watch").then(|| {
            self.metrics
                .kube_request_in_flight(class.verb, &class.resource, &class.subresource)
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let answer = response.await;
            drop(in_flight);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(method: Method, uri: &str, verb: &str, resource: &str, subresource: &str) {
        let class = classify(&method, &uri.parse().expect("test uri"));
        assert_eq!(
            (
                class.verb,
                class.resource.as_str(),
                class.subresource.as_str()
            ),
            (verb, resource, subresource),
            "{method} {uri}"
        );
    }

    #[test]
    fn reads_are_get_list_or_watch() {
        check(
            Method::GET,
            "/api/v1/namespaces/ws/secrets/db",
            "get",
            "secrets",
            "",
        );
        check(
            Method::GET,
            "/api/v1/namespaces/ws/secrets",
            "list",
            "secrets",
            "",
        );
        check(
            Method::GET,
            "/api/v1/secrets?labelSelector=a%3Db",
            "list",
            "secrets",
            "",
        );
        check(
            Method::GET,
            "/api/v1/namespaces/ws/secrets?watch=true&resourceVersion=10&timeoutSeconds=290",
            "watch",
            "secrets",
            "",
        );
        check(
            Method::GET,
            "/apis/tender.dev/v1alpha1/bundles?allowWatchBookmarks=true&watch=1",
            "watch",
            "bundles",
            "",
        );
        check(
            Method::GET,
            "/apis/tender.dev/v1alpha1/bundles?watch=false",
            "list",
            "bundles",
            "",
        );
    }

    #[test]
    fn writes_map_to_their_verbs() {
        check(
            Method::POST,
            "/api/v1/namespaces/c1/configmaps",
            "create",
            "configmaps",
            "",
        );
        check(
            Method::PATCH,
            "/apis/tender.dev/v1alpha1/namespaces/c1/bundledeployments/b?fieldManager=tender-hub&force=true",
            "patch",
            "bundledeployments",
            "",
        );
        check(
            Method::PUT,
            "/api/v1/namespaces/c1/secrets/s",
            "update",
            "secrets",
            "",
        );
        check(
            Method::DELETE,
            "/api/v1/namespaces/c1/secrets/s",
            "delete",
            "secrets",
            "",
        );
        check(
            Method::DELETE,
            "/api/v1/namespaces/c1/secrets",
            "deletecollection",
            "secrets",
            "",
        );
    }

    #[test]
    fn subresources_keep_the_parent_verb_and_are_labelled() {
        check(
            Method::PATCH,
            "/apis/tender.dev/v1alpha1/namespaces/c1/bundledeployments/b/status",
            "patch",
            "bundledeployments",
            "status",
        );
        check(
            Method::GET,
            "/apis/apps/v1/namespaces/x/deployments/d/scale",
            "get",
            "deployments",
            "scale",
        );
        check(
            Method::PUT,
            "/api/v1/namespaces/gone/finalize",
            "update",
            "namespaces",
            "finalize",
        );
        check(
            Method::PATCH,
            "/api/v1/namespaces/ws/status",
            "patch",
            "namespaces",
            "status",
        );
    }

    #[test]
    fn namespaces_and_cluster_scoped_resources() {
        check(Method::GET, "/api/v1/namespaces", "list", "namespaces", "");
        check(
            Method::GET,
            "/api/v1/namespaces/ws",
            "get",
            "namespaces",
            "",
        );
        check(
            Method::POST,
            "/api/v1/namespaces",
            "create",
            "namespaces",
            "",
        );
        check(
            Method::DELETE,
            "/api/v1/namespaces/ws",
            "delete",
            "namespaces",
            "",
        );
        check(
            Method::PATCH,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/bundles.tender.dev",
            "patch",
            "customresourcedefinitions",
            "",
        );
        check(
            Method::PATCH,
            "/apis/coordination.k8s.io/v1/namespaces/tender-system/leases/tender-hub",
            "patch",
            "leases",
            "",
        );
    }

    #[test]
    fn discovery_and_non_resource_paths_have_no_resource() {
        check(Method::GET, "/version", "get", "", "");
        check(Method::GET, "/apis", "get", "", "");
        check(Method::GET, "/apis/tender.dev/v1alpha1", "get", "", "");
        check(Method::GET, "/api/v1", "get", "", "");
        check(Method::GET, "/openapi/v3/apis/apps/v1", "get", "", "");
    }

    #[test]
    fn counting_layer_records_every_call() {
        use std::{convert::Infallible, future::Ready};

        #[derive(Clone)]
        struct Echo;
        impl Service<Request<()>> for Echo {
            type Response = ();
            type Error = Infallible;
            type Future = Ready<Result<(), Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: Request<()>) -> Self::Future {
                std::future::ready(Ok(()))
            }
        }

        let metrics = Arc::new(Metrics::new());
        let mut service = CountRequestsLayer {
            metrics: metrics.clone(),
        }
        .layer(Echo);
        for _ in 0..2 {
            let request = Request::patch("/api/v1/namespaces/c1/secrets/s")
                .body(())
                .expect("request");
            // Counting happens in `call`; the inner future is irrelevant here.
            drop(service.call(request));
        }
        let request = Request::get("/api/v1/namespaces/c1/secrets?watch=true")
            .body(())
            .expect("request");
        drop(service.call(request));

        assert_eq!(metrics.kube_requests("patch", "secrets", ""), 2);
        assert_eq!(metrics.kube_requests("watch", "secrets", ""), 1);
        assert_eq!(metrics.kube_requests("create", "secrets", ""), 0);
    }

    /// Drives a real kube `Client` against a canned HTTP server to prove the layer sits where
    /// kube's requests pass and that the user agent reaches the wire.
    #[tokio::test]
    async fn client_counts_real_requests_and_sends_user_agent() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, Patch, PatchParams};
        use tokio::{
            io::{AsyncReadExt, AsyncWriteExt},
            net::TcpListener,
        };

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            let body =
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"y","namespace":"x"}}"#;
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                // Headers fit one read for these tiny requests; bodies are not needed.
                let mut buf = vec![0u8; 16 * 1024];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });

        let metrics = Arc::new(Metrics::new());
        let config = Config::new(format!("http://{addr}").parse().expect("url"));
        let client =
            client_from_config(config, Some(metrics.clone()), "tender-test/0.0").expect("client");
        let api = Api::<ConfigMap>::namespaced(client, "x");
        api.get("y").await.expect("get");
        let patch = applied_config_map();
        api.patch(
            "y",
            &PatchParams::apply("tender-test"),
            &Patch::Apply(&patch),
        )
        .await
        .expect("patch");

        assert_eq!(metrics.kube_requests("get", "configmaps", ""), 1);
        assert_eq!(metrics.kube_requests("patch", "configmaps", ""), 1);
        let first = seen_rx.recv().await.expect("a request reached the server");
        assert!(
            first
                .to_ascii_lowercase()
                .contains("user-agent: tender-test/0.0"),
            "{first}"
        );
    }

    fn applied_config_map() -> k8s_openapi::api::core::v1::ConfigMap {
        k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("y".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}
