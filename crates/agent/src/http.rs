//! The operators' HTTP endpoint (`--metrics IP:PORT`), plain HTTP/1.1 with
//! no TLS, so monitoring needs no data-plane certificate; bind it to a
//! management address:
//!
//! * `GET /metrics`: [`crate::metrics`] in the OpenMetrics text format when the
//!   scraper asks for it (`Accept: application/openmetrics-text`, as
//!   Prometheus does), else Prometheus' text format 0.0.4;
//! * `GET /healthz`: readiness of the real path, `200` or `503` with a JSON
//!   body saying why ([`Health`]).

use crate::Shutdown;
use crate::metrics::Metrics;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// Readiness as the agent judges it: ready or not, and the details.
pub type Health = Arc<dyn Fn() -> (bool, serde_json::Value) + Send + Sync>;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds `addr` (an error names `--metrics`) and returns where it listens,
/// and the server to spawn, which runs until `shutdown`.
pub(crate) async fn start(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: Shutdown,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), crate::AgentError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| crate::AgentError::Listen {
            service: "metrics".into(),
            target: addr.to_string(),
            reason: e.to_string(),
        })?;
    let local = listener.local_addr()?;
    Ok((local, serve(listener, metrics, health, shutdown)))
}

fn respond(
    req: &Request<hyper::body::Incoming>,
    metrics: &Metrics,
    health: &Health,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let openmetrics = req.headers().get_all(ACCEPT).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.contains("application/openmetrics-text"))
            });
            let (ctype, body) = if openmetrics {
                (OPENMETRICS, metrics.encode(true))
            } else {
                (PROMETHEUS_TEXT, metrics.encode(false))
            };
            reply(StatusCode::OK, ctype, body)
        }
        "/healthz" => {
            let (ready, details) = health();
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            reply(status, "application/json", format!("{details}\n"))
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics or /healthz\n".into(),
        ),
    }
}

/// Serves until `shutdown`.
async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Health, shutdown: Shutdown) {
    loop {
        let (stream, peer) = tokio::select! {
            c = listener.accept() => match c {
                Ok(c) => c,
                Err(e) => {
                    warn!("metrics endpoint: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.wait() => return,
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        let service = hyper::service::service_fn(move |req| {
            let r = respond(&req, &metrics, &health);
            async move { Ok::<_, std::convert::Infallible>(r) }
        });
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::select! {
                r = conn => if let Err(e) = r {
                    debug!(%peer, "metrics endpoint connection: {e}");
                },
                _ = shutdown.wait() => {}
            }
        });
    }
}
