//! The other endpoints: `/v1/models`, `/health`, `/metrics`, and the answers to unknown routes
//! and methods.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    st.metrics.count_request("/v1/models", 200);
    Json(json!({"object": "list", "data": [{
        "id": st.model_name, "object": "model", "created": st.created, "owned_by": "nemotron-rs",
        "max_model_len": st.context_length,
    }]}))
    .into_response()
}

pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.load.stopped.load(Ordering::SeqCst) {
        st.metrics.count_request("/health", 503);
        return ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped")
            .into_response();
    }
    st.metrics.count_request("/health", 200);
    Json(json!({"status": "ok"})).into_response()
}

pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    st.metrics.count_request("/metrics", 200);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::status(StatusCode::NOT_FOUND, format!("no route {}", uri.path())).into_response()
}

pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
    .into_response()
}
