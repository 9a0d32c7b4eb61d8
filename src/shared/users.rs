//! The system's user database: a user's name (for error messages) and whether a user
//! belongs to a group (for trusting a file of a trusted group).

/// Bytes for the strings of one user's entry (name, home, shell, ...).
const ENTRY_BUFFER: usize = 16 * 1024;

/// `f` of user `uid`'s entry in the user database, or `None` where it has none (or the
/// lookup fails). The entry's strings are alive for the call.
fn with_entry<T>(uid: u32, f: impl FnOnce(&libc::passwd) -> T) -> Option<T> {
    let mut buffer = vec![0 as libc::c_char; ENTRY_BUFFER];
    // SAFETY: an all-zero `passwd` is a valid value of that plain C struct.
    let mut entry: libc::passwd = unsafe { core::mem::zeroed() };
    let mut found: *mut libc::passwd = core::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: `entry` and `found` for writes,
    // `buffer` for `buffer.len()` bytes; the strings `entry` points to live in `buffer`.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || entry.pw_name.is_null() {
        return None;
    }
    // `buffer`, which the entry's strings point into, outlives the call.
    Some(f(&entry))
}

/// The name of user `uid` in the system's user database, if it has one.
pub(super) fn user_name(uid: u32) -> Option<String> {
    with_entry(uid, |entry| {
        // SAFETY: `pw_name` is not null (`with_entry` checks) and points to a
        // NUL-terminated string inside the entry's buffer, alive for this call.
        let name = unsafe { core::ffi::CStr::from_ptr(entry.pw_name) };
        name.to_string_lossy().into_owned()
    })
}

/// Whether user `uid` belongs to group `gid` (as its primary group or a supplementary one).
pub(super) fn member(uid: u32, gid: u32) -> bool {
    with_entry(uid, |entry| {
        if entry.pw_gid == gid {
            return true;
        }
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut count = groups.len() as libc::c_int;
        #[allow(clippy::unnecessary_cast)] // the argument's type differs between C libraries
        let primary = entry.pw_gid as _;
        // SAFETY: `pw_name` points into the entry's buffer (alive for this call); `groups`
        // holds `count` entries.
        let rc = unsafe {
            libc::getgrouplist(
                entry.pw_name,
                primary,
                groups.as_mut_ptr().cast(),
                &mut count,
            )
        };
        #[allow(clippy::unnecessary_cast)] // `gid_t` differs between C libraries
        let listed = |g: &libc::gid_t| *g as u32 == gid;
        rc >= 0 && groups[..count.max(0) as usize].iter().any(listed)
    })
    .unwrap_or(false)
}
