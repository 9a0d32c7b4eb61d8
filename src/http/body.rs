//! The response body a refusal is written into, for each server framework's body type.

use bytes::Bytes;

/// A response body a refusal can be written into: the body type of the service a
/// [`RateLimitLayer`](super::RateLimitLayer) wraps. Implemented for axum's body (feature
/// `axum`), tonic's (feature `tonic`), and hyper users' `Full<Bytes>` and `String`;
/// implement it for a body type of your own.
///
/// # Examples
///
/// ```
/// use paceline::http::RefusalBody;
/// struct MyBody(Vec<u8>);
/// impl RefusalBody for MyBody {
///     fn from_text(text: String) -> MyBody {
///         MyBody(text.into_bytes())
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "paceline cannot write a refusal into a `{Self}` response body",
    label = "the wrapped service's response body",
    note = "for axum, enable paceline's `axum` feature; for tonic, its `tonic` feature",
    note = "for a body type of your own, implement `paceline::http::RefusalBody` for it"
)]
pub trait RefusalBody: Sized {
    /// A body holding `text` (empty for gRPC refusals, which carry their message in
    /// headers).
    fn from_text(text: String) -> Self;

    /// A body holding `bytes` (UTF-8 text), shared with the layer's prebuilt refusals.
    /// Implement it for a body that can hold `Bytes` without copying; the default copies
    /// them into [`RefusalBody::from_text`].
    fn from_bytes(bytes: Bytes) -> Self {
        Self::from_text(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl RefusalBody for String {
    fn from_text(text: String) -> String {
        text
    }
}

impl RefusalBody for Bytes {
    fn from_text(text: String) -> Bytes {
        Bytes::from(text)
    }

    fn from_bytes(bytes: Bytes) -> Bytes {
        bytes
    }
}

impl RefusalBody for http_body_util::Full<Bytes> {
    fn from_text(text: String) -> Self {
        http_body_util::Full::new(Bytes::from(text))
    }

    fn from_bytes(bytes: Bytes) -> Self {
        http_body_util::Full::new(bytes)
    }
}

#[cfg(feature = "axum")]
impl RefusalBody for axum::body::Body {
    fn from_text(text: String) -> Self {
        axum::body::Body::from(text)
    }

    fn from_bytes(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }
}

#[cfg(feature = "tonic")]
impl RefusalBody for tonic::body::Body {
    fn from_text(text: String) -> Self {
        if text.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(text)
        }
    }
}
