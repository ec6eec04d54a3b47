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
