//! The node's operations HTTP port (`metrics_listen`): Prometheus'
//! `/metrics`, and a read-only web console at `/` whose page polls
//! `/api/overview` every second and `/api/dead-letters` every few seconds.
//!
//! The page and its script are one file embedded in the binary
//! (`page.html`): no build step, nothing fetched from elsewhere. The JSON
//! endpoints answer what the Admin service answers (cluster status, queue
//! statistics, dead letters), gathered from every node, so any node's
//! console shows the whole cluster. With token keys they need an admin's
//! token (`Authorization: Bearer`), which the page asks for; `/metrics`
//! needs none, like any Prometheus target, so bind it where only the
//! monitoring reaches it.
//!
//! IMPLEMENTATION CAVEATS
//! - Each queue shows its [`PRODUCERS_SHOWN`] producers with the largest
//!   backlog; the JSON and the page do not page through the rest.
//! - Plain HTTP only: the port has no TLS.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use floret_proto::v1;
use floret_proto::v1::admin_server::Admin;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::{Authenticate, Caller};
use crate::service::admin::AdminService;

mod overview;

/// Producers per queue the console lists, those with the largest backlog.
pub const PRODUCERS_SHOWN: usize = 50;

/// Dead letters per queue the console lists, the newest.
const DEAD_LETTERS_SHOWN: u32 = 20;

/// The page, with its style and script.
const PAGE: &str = include_str!("page.html");

/// What the endpoints read.
pub struct ConsoleParts {
    /// Renders the Prometheus export.
    pub metrics: PrometheusHandle,
    /// Cluster status, queue statistics and dead letters.
    pub admin: Arc<AdminService>,
    /// Checks the token of a JSON call.
    pub authenticate: Authenticate,
}

/// Serves the operations port on `listener` until `stopping` turns true.
pub fn spawn(
    listener: TcpListener,
    parts: ConsoleParts,
    mut stopping: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let router = Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/api/overview", get(overview))
        .route("/api/dead-letters", get(dead_letters))
        .with_state(Arc::new(parts));
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stopping.wait_for(|stopping| *stopping).await;
        };
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(%error, "the metrics and console port stopped");
        }
    })
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}

async fn metrics(State(parts): State<Arc<ConsoleParts>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        parts.metrics.render(),
    )
}

async fn overview(State(parts): State<Arc<ConsoleParts>>, headers: HeaderMap) -> Response {
    let caller = match admin_caller(&parts.authenticate, &headers) {
        Ok(caller) => caller,
        Err((code, why)) => return error(code, &why),
    };
    let status = parts
        .admin
        .cluster_status(with_caller(v1::ClusterStatusRequest {}, &caller))
        .await;
    let queues = parts
        .admin
        .queue_stats(with_caller(v1::QueueStatsRequest::default(), &caller))
        .await;
    match (status, queues) {
        (Ok(status), Ok(queues)) => json(&overview::Overview::new(
            status.into_inner(),
            queues.into_inner(),
            crate::service::now_unix_ms(),
        )),
        (Err(status), _) | (_, Err(status)) => failed(&status),
    }
}

async fn dead_letters(State(parts): State<Arc<ConsoleParts>>, headers: HeaderMap) -> Response {
    let caller = match admin_caller(&parts.authenticate, &headers) {
        Ok(caller) => caller,
        Err((code, why)) => return error(code, &why),
    };
    let queues = match parts
        .admin
        .queue_stats(with_caller(v1::QueueStatsRequest::default(), &caller))
        .await
    {
        Ok(queues) => queues.into_inner().queues,
        Err(status) => return failed(&status),
    };
    let mut listed = Vec::new();
    for queue in queues {
        let request = v1::ListDeadLettersRequest {
            queue: queue.queue.clone(),
            limit: DEAD_LETTERS_SHOWN,
        };
        match parts
            .admin
            .list_dead_letters(with_caller(request, &caller))
            .await
        {
            Ok(answer) => listed.extend(
                answer
                    .into_inner()
                    .dead_letters
                    .into_iter()
                    .map(|letter| overview::DeadLetterRow::new(&queue.queue, letter)),
            ),
            Err(status) => return failed(&status),
        }
    }
    json(&listed)
}

/// The caller the request's bearer token names, if it is an administrator;
/// otherwise the HTTP status refusing it, and why.
fn admin_caller(
    authenticate: &Authenticate,
    headers: &HeaderMap,
) -> Result<Arc<Caller>, (StatusCode, String)> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(value) = headers.get(header::AUTHORIZATION)
        && let Ok(value) = tonic::metadata::MetadataValue::try_from(value.as_bytes())
    {
        metadata.insert("authorization", value);
    }
    let now_unix_s = crate::service::now_unix_ms() as u64 / 1_000;
    let caller = authenticate
        .caller(&metadata, None, now_unix_s)
        .map_err(|refusal| {
            tracing::warn!(target: "audit", reason = refusal.reason, message = ?refusal.message, "console call refused: not authenticated");
            crate::auth::count_refusal(refusal.reason);
            (StatusCode::UNAUTHORIZED, refusal.message)
        })?;
    caller.require_admin("the web console").map_err(|denied| {
        denied.audit(&caller, "the web console");
        (StatusCode::FORBIDDEN, denied.message)
    })?;
    Ok(caller)
}

fn with_caller<T>(message: T, caller: &Arc<Caller>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(caller.clone());
    request
}

fn json<T: serde::Serialize>(body: &T) -> Response {
    match serde_json::to_string(body) {
        Ok(text) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            text,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// An Admin call that failed, as the page shows it.
fn failed(status: &tonic::Status) -> Response {
    let code = match status.code() {
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(code, status.message())
}

fn error(code: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
