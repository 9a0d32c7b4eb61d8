//! A fake upstream API on a loopback port: it enforces its own limit (GCRA, a fixed
//! window, or paceline's own `RateLimitLayer`) and says so the way it is told to, and it
//! logs every request it sees. The upstream tests and the upstream matrix benchmark
//! (`benches/examples/upstream_matrix.rs`) share it.

#![allow(dead_code)] // each user takes a different part

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, HeaderValue, StatusCode};
use paceline::http::{KeySource, Limit, RateLimitLayer};
use paceline::{Limiter, Quota};

/// What the upstream says about its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fields {
    /// `RateLimit-Policy` and `RateLimit` on every response, `Retry-After` on refusals.
    Ietf,
    /// `Retry-After` on refusals, nothing else.
    RetryAfter,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds) on every response.
    X,
    /// A bare 429.
    Bare,
}

/// How the upstream behaves; change it with [`Upstream::set`].
#[derive(Clone, Debug)]
pub struct Behavior {
    /// Requests per second (per window, with `window`).
    pub rate: u32,
    /// The GCRA burst (ignored with `window`).
    pub burst: u32,
    /// A fixed window of `rate` requests, aligned to the Unix clock.
    pub window: Option<Duration>,
    pub fields: Fields,
    /// A `RateLimit-Policy` value sent instead of the upstream's own.
    pub policy: Option<String>,
    /// Fields added to every response.
    pub extra: Vec<(String, String)>,
    /// Fields added to every refusal.
    pub refusal_extra: Vec<(String, String)>,
    /// Sends `Date` this many seconds off the local clock, and `Retry-After` as an
    /// HTTP-date on that clock.
    pub date_skew: Option<i64>,
    /// Refuses every request with this `Retry-After`.
    pub refuse_all: Option<u64>,
}

impl Default for Behavior {
    /// 50 per second, bursts of 10, the IETF fields.
    fn default() -> Behavior {
        Behavior {
            rate: 50,
            burst: 10,
            window: None,
            fields: Fields::Ietf,
            policy: None,
            extra: Vec::new(),
            refusal_extra: Vec::new(),
            date_skew: None,
            refuse_all: None,
        }
    }
}

/// (arrival, status, `Retry-After` seconds sent) of each request.
pub type Log = Arc<Mutex<Vec<(Instant, u16, Option<u64>)>>>;

struct State {
    behavior: Behavior,
    limiter: Limiter,
    /// The fixed window's start (Unix nanoseconds) and count.
    window: (u128, u32),
}

/// A running fake upstream.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub log: Log,
    state: Option<Arc<Mutex<State>>>,
}

impl Upstream {
    /// Serves `behavior` on an ephemeral loopback port.
    pub async fn start(behavior: Behavior) -> Upstream {
        Upstream::start_on("127.0.0.1:0", behavior).await
    }

    /// Serves `behavior` on `addr`.
    pub async fn start_on(addr: &str, behavior: Behavior) -> Upstream {
        epoch();
        let state = Arc::new(Mutex::new(State {
            limiter: limiter(&behavior),
            behavior,
            window: (0, 0),
        }));
        let log: Log = Arc::default();
        let (shared, logged) = (state.clone(), log.clone());
        let app = Router::new().route(
            "/",
            get(move || {
                let (state, log) = (shared.clone(), logged.clone());
                async move { respond(&state, &log) }
            }),
        );
        let addr = serve(addr, with_log_route(app, &log)).await;
        Upstream {
            addr,
            log,
            state: Some(state),
        }
    }

    /// paceline's own `RateLimitLayer` allowing `quota` to everyone (its default fields:
    /// `Retry-After` and the IETF fields on refusals).
    pub async fn paceline(quota: Quota) -> Upstream {
        epoch();
        let log: Log = Arc::default();
        let logged = log.clone();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new().limit(Limit::new("api", quota, KeySource::global())))
            // Outside the limit: sees every request, refused or not.
            .layer(middleware::from_fn(move |request: Request, next: Next| {
                let log = logged.clone();
                async move {
                    let response: Response = next.run(request).await;
                    let retry_after = response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse().ok());
                    log.lock().unwrap().push((
                        Instant::now(),
                        response.status().as_u16(),
                        retry_after,
                    ));
                    response
                }
            }));
        let addr = serve("127.0.0.1:0", with_log_route(app, &log)).await;
        Upstream {
            addr,
            log,
            state: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Changes the behaviour (a new limiter: its burst is whole again).
    pub fn set(&self, behavior: Behavior) {
        let state = self.state.as_ref().expect("not paceline's own layer");
        let mut state = state.lock().unwrap();
        state.limiter = limiter(&behavior);
        state.behavior = behavior;
        state.window = (0, 0);
    }

    /// The log so far, emptied.
    pub fn take_log(&self) -> Vec<(Instant, u16, Option<u64>)> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// Adds `GET /log`, outside any limit: the log so far as lines of `seconds status
/// retry-after` (seconds since the first request ever logged by this process), emptied.
fn with_log_route(app: Router, log: &Log) -> Router {
    let log = log.clone();
    Router::new()
        .route(
            "/log",
            get(move || {
                let log = log.clone();
                async move {
                    let rows = std::mem::take(&mut *log.lock().unwrap());
                    let mut text = String::new();
                    for (at, status, retry_after) in rows {
                        let secs = at.duration_since(epoch()).as_secs_f64();
                        let ra = retry_after.map_or("-".to_owned(), |s| s.to_string());
                        text.push_str(&format!("{secs:.6} {status} {ra}\n"));
                    }
                    text
                }
            }),
        )
        .merge(app)
}

/// A fixed instant of this process, before any request.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| Instant::now() - Duration::from_secs(1))
}

fn limiter(behavior: &Behavior) -> Limiter {
    Limiter::new(Quota::per_second(behavior.rate.max(1)).with_burst(behavior.burst.max(1)))
}

async fn serve(addr: &str, app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// (admitted, remaining, until more, until whole).
fn decide(state: &mut State) -> (bool, u64, Duration, Duration) {
    let behavior = &state.behavior;
    if let Some(window) = behavior.window {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let w = window.as_nanos();
        let start = now / w * w;
        if state.window.0 != start {
            state.window = (start, 0);
        }
        let end = Duration::from_nanos((start + w - now) as u64);
        if state.window.1 < behavior.rate {
            state.window.1 += 1;
            return (true, u64::from(behavior.rate - state.window.1), end, end);
        }
        return (false, 0, end, end);
    }
    let admitted = state.limiter.check().is_ok();
    let snapshot = state.limiter.snapshot();
    (
        admitted,
        u64::from(snapshot.remaining()),
        snapshot.until_next(),
        snapshot.until_full(),
    )
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn respond(state: &Mutex<State>, log: &Log) -> Response {
    let mut state = state.lock().unwrap();
    let (admitted, remaining, wait, full) = match state.behavior.refuse_all {
        Some(secs) => (
            false,
            0,
            Duration::from_secs(secs),
            Duration::from_secs(secs),
        ),
        None => decide(&mut state),
    };
    let behavior = &state.behavior;
    let mut headers: Vec<(String, String)> = behavior.extra.clone();
    let mut retry_after = None;
    if !admitted {
        let secs = ceil_secs(wait).max(1);
        retry_after = Some(secs);
        headers.extend(behavior.refusal_extra.iter().cloned());
        if matches!(behavior.fields, Fields::Ietf | Fields::RetryAfter) {
            let value = match behavior.date_skew {
                Some(skew) => http_date(unix_now().saturating_add_signed(skew) + secs),
                None => secs.to_string(),
            };
            headers.push(("retry-after".into(), value));
        }
    }
    if let Some(skew) = behavior.date_skew {
        headers.push((
            "date".into(),
            http_date(unix_now().saturating_add_signed(skew)),
        ));
    }
    let reset = ceil_secs(if remaining == 0 { wait } else { full }).max(1);
    match behavior.fields {
        Fields::Ietf => {
            let window = behavior.window.map_or(1, |w| w.as_secs().max(1));
            let policy = behavior
                .policy
                .clone()
                .unwrap_or_else(|| format!("\"default\";q={};w={window}", behavior.rate));
            headers.push(("ratelimit-policy".into(), policy));
            headers.push((
                "ratelimit".into(),
                format!("\"default\";r={remaining};t={reset}"),
            ));
        }
        Fields::X => {
            headers.push(("x-ratelimit-limit".into(), behavior.rate.to_string()));
            headers.push(("x-ratelimit-remaining".into(), remaining.to_string()));
            headers.push(("x-ratelimit-reset".into(), reset.to_string()));
        }
        Fields::RetryAfter | Fields::Bare => {}
    }
    let status = if admitted {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    log.lock()
        .unwrap()
        .push((Instant::now(), status.as_u16(), retry_after));
    drop(state);
    let mut response = Response::new(Body::from("ok"));
    *response.status_mut() = status;
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(unix: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (days, secs) = (unix / 86_400, unix % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        secs / 3_600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Refused share and successes per second of a log, from the first success to the last,
/// less the first refusal's `Retry-After` (a first hold is allowed for).
pub fn measure(log: &[(Instant, u16, Option<u64>)]) -> (f64, f64) {
    let refused = log.iter().filter(|(_, s, _)| *s == 429).count();
    let ok: Vec<Instant> = log
        .iter()
        .filter(|(_, s, _)| *s == 200)
        .map(|(t, _, _)| *t)
        .collect();
    let first_hold = log
        .iter()
        .find_map(|(_, s, ra)| (*s == 429).then_some(ra.unwrap_or(0)))
        .unwrap_or(0);
    let rate = match (ok.first(), ok.last()) {
        (Some(a), Some(b)) if ok.len() > 1 => {
            let span = b.duration_since(*a).as_secs_f64() - first_hold as f64;
            (ok.len() - 1) as f64 / span.max(1e-9)
        }
        _ => 0.0,
    };
    (refused as f64 / log.len().max(1) as f64, rate)
}
