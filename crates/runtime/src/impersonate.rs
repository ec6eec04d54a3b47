//! A client acting as another identity: Kubernetes impersonation headers (`Impersonate-User`,
//! `Impersonate-Group`) on every request of an existing client, whatever its own credentials
//! are (in-cluster token, kubeconfig, a push cluster's Secret). The apiserver authorizes each
//! request as the impersonated user after checking that the client may `impersonate` it.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response};
use kube::Client;
use kube::client::Body;
use tower::Service;

const USER: HeaderName = HeaderName::from_static("impersonate-user");
const GROUP: HeaderName = HeaderName::from_static("impersonate-group");

/// A client sending `client`'s requests as `user` with `groups`; `Err` when a name cannot be
/// a header value.
pub fn impersonating(
    client: &Client,
    user: &str,
    groups: &[String],
) -> Result<Client, http::header::InvalidHeaderValue> {
    let mut headers = vec![(USER, HeaderValue::from_str(user)?)];
    for g in groups {
        headers.push((GROUP, HeaderValue::from_str(g)?));
    }
    let service = Impersonate {
        inner: client.clone(),
        headers: Arc::new(headers),
    };
    Ok(Client::new(service, client.default_namespace()))
}

#[derive(Clone)]
struct Impersonate {
    inner: Client,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
}

impl Service<Request<Body>> for Impersonate {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = futures::future::BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner client is a buffered service; `send` waits for it to be ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let headers = request.headers_mut();
        headers.remove(USER);
        headers.remove(GROUP);
        for (name, value) in self.headers.iter() {
            headers.append(name.clone(), value.clone());
        }
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::Api;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A canned apiserver answering one request with 404 and reporting its request head.
    async fn canned() -> (Client, tokio::sync::oneshot::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 64 * 1024];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).to_lowercase());
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
            let response = format!(
                "HTTP/1.1 404 X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
        let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        (Client::try_from(config).expect("client"), seen_rx)
    }

    #[tokio::test]
    async fn every_request_carries_the_impersonated_user_and_answers_come_back_unchanged() {
        let (inner, seen) = canned().await;
        let sa = "system:serviceaccount:tender-system:tender-bundles";
        let client = impersonating(&inner, sa, &[]).expect("client");
        let api: Api<ConfigMap> = Api::namespaced(client, "apps");
        // The apiserver's answer reaches the caller as if no layer were in between.
        assert!(
            api.get_opt("settings")
                .await
                .expect("a 404 is None")
                .is_none()
        );
        let head = seen.await.expect("a request");
        assert!(head.contains(&format!("impersonate-user: {sa}")), "{head}");
        // No groups: the apiserver derives a ServiceAccount's groups itself.
        assert!(!head.contains("impersonate-group"), "{head}");
    }

    #[tokio::test]
    async fn groups_are_sent_when_given() {
        let (inner, seen) = canned().await;
        let groups = ["team-a".to_string(), "team-b".to_string()];
        let client = impersonating(&inner, "jane", &groups).expect("client");
        let api: Api<ConfigMap> = Api::namespaced(client, "apps");
        let _ = api.get_opt("settings").await;
        let head = seen.await.expect("a request");
        assert!(head.contains("impersonate-group: team-a"), "{head}");
        assert!(head.contains("impersonate-group: team-b"), "{head}");
        assert!(impersonating(&inner, "bad\nname", &[]).is_err());
    }
}
