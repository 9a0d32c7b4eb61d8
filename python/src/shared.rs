//! Shared files from Python: their errors as Python's, and the options they open with.

use paceline::shared::{OnMismatch, OpenOptions, SharedError};
use paceline::Quota;
use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;

/// A shared file's error as Python's: the system's refusals as `OSError`, a file someone
/// else owns or can write as `PermissionError`, a file that is not what was asked for
/// (another quota, a damaged or foreign file) as `ValueError`, a budget's lock held past
/// patience by a stopped process as `TimeoutError`, a budget's record full as
/// `RuntimeError`; the fixes in Python's words.
pub(crate) fn shared_error(e: SharedError) -> PyErr {
    let describe = |q: Quota| {
        format!(
            "1 cell every {:?}, bursts of {}",
            q.emission_interval(),
            q.burst()
        )
    };
    match e {
        SharedError::Io { ref source, .. } => match source.kind() {
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(e.to_string()),
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(e.to_string()),
            _ => PyOSError::new_err(e.to_string()),
        },
        SharedError::NotLocal { .. } => PyOSError::new_err(e.to_string()),
        // Another process stopped inside a budget's lock: a wait that ran out.
        SharedError::Locked { .. } => PyTimeoutError::new_err(e.to_string()),
        SharedError::TooManyCallers { .. } => PyRuntimeError::new_err(e.to_string()),
        SharedError::Untrusted { owner, group, .. } => PyPermissionError::new_err(
            // The Rust message, with its options as Python's arguments.
            e.to_string()
                .replace(
                    &format!("OpenOptions::trust_user({owner})"),
                    &format!("trust_user={owner}"),
                )
                .replace(
                    &format!("OpenOptions::trust_group({group})"),
                    &format!("trust_group={group}"),
                ),
        ),
        SharedError::Capacity { asked } => PyValueError::new_err(format!(
            "capacity must be between 1 and {} keys, got {asked}",
            paceline::shared::MAX_CAPACITY
        )),
        SharedError::CapacityMismatch { path, file, asked } => PyValueError::new_err(format!(
            "{}: the file was made for {file} keys, not the {asked} asked for (pass \
             on_mismatch=\"adopt\" to use the file's)",
            path.display()
        )),
        SharedError::QuotaMismatch { path, file, asked } => PyValueError::new_err(format!(
            "{}: the file enforces {}, not the {} asked for (pass on_mismatch=\"adopt\" to \
             use the file's, or on_mismatch=\"replace\" to set yours for every process)",
            path.display(),
            describe(file),
            describe(asked)
        )),
        SharedError::BudgetMismatch { .. } | SharedError::BadBudget { .. } => {
            PyValueError::new_err(
                e.to_string()
                    .replace("OnMismatch::Adopt", "on_mismatch=\"adopt\""),
            )
        }
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// The options a shared file is opened with, from Python's arguments.
pub(crate) fn open_options(
    mismatch: &str,
    trust_user: Option<u32>,
    trust_group: Option<u32>,
    name: Option<String>,
) -> PyResult<OpenOptions> {
    let mut options = OpenOptions::new().on_mismatch(on_mismatch(mismatch)?);
    if let Some(uid) = trust_user {
        options = options.trust_user(uid);
    }
    if let Some(gid) = trust_group {
        options = options.trust_group(gid);
    }
    if let Some(name) = name {
        options = options.name(name);
    }
    Ok(options)
}

/// What to do with a file holding another quota: "refuse", "adopt" or "replace".
pub(crate) fn on_mismatch(name: &str) -> PyResult<OnMismatch> {
    match name {
        "refuse" => Ok(OnMismatch::Refuse),
        "adopt" => Ok(OnMismatch::Adopt),
        "replace" => Ok(OnMismatch::Replace),
        other => Err(PyValueError::new_err(format!(
            "on_mismatch must be \"refuse\", \"adopt\" or \"replace\", got {other:?}"
        ))),
    }
}
